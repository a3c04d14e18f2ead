// checkpoint/object_save.cc: checkpoint/object_save.h over storage's ObjectStore.
#include "checkpoint/object_save.h"

#include <algorithm>
#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <map>
#include <mutex>
#include <set>

#include "ckpt/config.h"
#include "format/names.h"
#include "storage/fs.h"

#if CKPT_HAVE_S3
#include "storage/object_commit.h"
#include "storage/object_store.h"
#include "storage/s3_config.h"
#include "storage/s3_sign.h"
#include "storage/s3_store.h"
#endif

namespace ckpt::internal {

namespace fs = std::filesystem;

bool IsObjectUrl(const fs::path& dir) { return dir.native().rfind("s3://", 0) == 0; }

#if !CKPT_HAVE_S3

namespace {
[[noreturn]] void NoS3(const std::string& url) {
  throw Error(ErrorCode::kInvalidArgument, url + ": this libckpt was built without S3 support (CKPT_WITH_S3)");
}
}  // namespace

struct ObjectSave::Impl {};
ObjectSave::ObjectSave(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ObjectSave::~ObjectSave() = default;
std::unique_ptr<ObjectSave> ObjectSave::Begin(const std::string& url, const ObjectStoreOptions&, bool) { NoS3(url); }
std::unique_ptr<ObjectSave> ObjectSave::Join(const std::string& url, const ObjectStoreOptions&, const std::string&) {
  NoS3(url);
}
std::string ObjectSave::ObjectName(const std::string& file) const { return file; }
const fs::path& ObjectSave::LocalStaging(const std::string&) { NoS3("s3://"); }
std::function<void(uint64_t, uint64_t)> ObjectSave::StreamUpload(const std::string&) { NoS3("s3://"); }
void ObjectSave::Upload(const std::string&) { NoS3("s3://"); }
void ObjectSave::UploadFrom(const fs::path&, const std::string&) { NoS3("s3://"); }
void ObjectSave::Commit(const Metadata&) { NoS3("s3://"); }
void ObjectSave::DiscardUploads() noexcept {}
std::size_t CleanObjectLeftovers(const std::string& url, const ObjectStoreOptions&) { NoS3(url); }
std::vector<std::string> ListCommittedObjects(const std::string& url, const ObjectStoreOptions&) { NoS3(url); }
void RemoveObjectCheckpoint(const std::string& url, const ObjectStoreOptions&) { NoS3(url); }
void DownloadObjectCheckpoint(const std::string& url, const ObjectStoreOptions&, const fs::path&, uint64_t) {
  NoS3(url);
}
CacheDir::~CacheDir() = default;
std::unique_ptr<CacheDir> DownloadToCache(const std::string& url, const ObjectStoreOptions&, int) { NoS3(url); }
void ThrowIfCommitChanged(storage::ObjectStore&, const std::string&, const std::string&, const std::string& url,
                          uint64_t, const Error&) {
  NoS3(url);
}
std::shared_ptr<storage::ObjectStore> OpenObjectStore(const ObjectStoreOptions&, const std::string& url) {
  NoS3(url);
}
void SetObjectStoreWrapperForTest(
    std::function<std::shared_ptr<storage::ObjectStore>(std::shared_ptr<storage::ObjectStore>)>) {}

#else

namespace {

constexpr uint64_t kMaxMetadataBytes = 1ull << 30;  // as ParseLimits allows

std::mutex g_mu;
std::function<std::shared_ptr<storage::ObjectStore>(std::shared_ptr<storage::ObjectStore>)> g_wrap;
// Buckets whose conditional PUT was probed and found honoured, by endpoint and bucket.
std::set<std::string> g_probed;

storage::UploadOptions ToUploadOptions(const ObjectStoreOptions& o) {
  storage::UploadOptions u;
  u.part_bytes = o.part_bytes;
  u.parallel = o.upload_concurrency;
  if (o.part_bytes < (5ull << 20) || o.part_bytes > (5ull << 30) || o.upload_concurrency < 1) {
    throw Error(ErrorCode::kInvalidArgument,
                "ObjectStoreOptions: part_bytes must be 5 MiB..5 GiB and upload_concurrency >= 1");
  }
  return u;
}

struct Target {
  std::string url;
  std::string bucket;
  std::string prefix;  // no trailing '/'
  std::shared_ptr<storage::ObjectStore> store;
  std::string endpoint;

  std::string Key(const std::string& name) const { return prefix.empty() ? name : prefix + "/" + name; }
  std::string Url(const std::string& name) const { return "s3://" + bucket + "/" + Key(name); }
};

// An S3Store of `options` (its endpoint in `endpoint`), through the test wrapper if one is set.
// A configuration error (no credentials, a bad endpoint) names the URL it was opened for.
std::shared_ptr<storage::ObjectStore> OpenStore(const ObjectStoreOptions& options, std::string* endpoint,
                                                const std::string& url) {
  std::shared_ptr<storage::S3Store> store;
  try {
    store = std::make_shared<storage::S3Store>(ToS3Options(options));
  } catch (const Error& e) {
    throw Error(e.code(), url + ": " + e.what());
  }
  if (endpoint) *endpoint = store->config().endpoint;
  std::lock_guard lock(g_mu);
  if (g_wrap) return g_wrap(store);
  return store;
}

// The store and the parsed URL; `need_prefix`: a checkpoint (not a bucket's root).
Target Open(const std::string& url, const ObjectStoreOptions& options, bool need_prefix) {
  Target t;
  t.url = url;
  const storage::s3::S3Url parsed = storage::s3::ParseS3Url(url);
  t.bucket = parsed.bucket;
  t.prefix = parsed.prefix;
  while (!t.prefix.empty() && t.prefix.back() == '/') t.prefix.pop_back();
  if (need_prefix && t.prefix.empty()) {
    throw Error(ErrorCode::kInvalidArgument, url + ": a checkpoint needs a prefix below the bucket (s3://bucket/name)");
  }
  t.store = OpenStore(options, &t.endpoint, url);
  return t;
}

// The names metadata.json at `key` lists in files[], or nullopt when there is none.
std::optional<std::set<std::string>> NamedFiles(storage::ObjectStore& store, const std::string& bucket,
                                                const std::string& key) {
  std::vector<std::byte> body;
  try {
    body = store.Get(bucket, key, kMaxMetadataBytes);
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kNotFound) return std::nullopt;
    throw;
  }
  const Metadata m = ParseMetadata({reinterpret_cast<const char*>(body.data()), body.size()}, "s3://" + bucket + "/" + key);
  std::set<std::string> names;
  for (const FileMeta& f : m.files) names.insert(f.name);
  return names;
}

bool IsHex(char c) { return (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f'); }

// "shard-00000-of-00004.0123456789abcdef.h5": a name only a save of ours makes.
bool IsSaveObjectName(const std::string& name) {
  constexpr std::size_t kLen = 20 + 1 + 16 + 3;
  if (name.size() != kLen || name.compare(0, 6, "shard-") != 0 || name.compare(11, 4, "-of-") != 0 ||
      name[20] != '.' || name.compare(37, 3, ".h5") != 0)
    return false;
  for (std::size_t i : {6, 7, 8, 9, 10, 15, 16, 17, 18, 19})
    if (name[i] < '0' || name[i] > '9') return false;
  for (std::size_t i = 21; i < 37; ++i)
    if (!IsHex(name[i])) return false;
  return true;
}

// "<prefix>/.ckpt-probe-0123456789abcdef": the conditional-PUT probe's object (Begin), left
// behind when a save is killed while probing.
bool IsProbeObjectName(const std::string& name) {
  constexpr std::size_t kTag = sizeof ".ckpt-probe-" - 1;
  return name.size() == kTag + 16 && name.compare(0, kTag, ".ckpt-probe-") == 0 &&
         std::all_of(name.begin() + kTag, name.end(), IsHex);
}

// Seconds since the epoch of an ISO 8601 time ("2026-12-07T04:09:04.000Z"), or nullopt.
std::optional<std::time_t> ParseIsoTime(const std::string& s) {
  std::tm tm{};
  int year, mon;
  if (std::sscanf(s.c_str(), "%4d-%2d-%2dT%2d:%2d:%2d", &year, &mon, &tm.tm_mday, &tm.tm_hour, &tm.tm_min,
                  &tm.tm_sec) != 6)
    return std::nullopt;
  tm.tm_year = year - 1900;
  tm.tm_mon = mon - 1;
  return timegm(&tm);
}

bool OlderThan(const std::string& when, int64_t grace_seconds, std::time_t now) {
  const auto t = ParseIsoTime(when);
  return t && now - *t >= grace_seconds;  // a time we cannot read is never old enough
}

std::size_t CleanTarget(const Target& t, int64_t grace_seconds) {
  const std::time_t now = std::time(nullptr);
  const std::string root = t.prefix.empty() ? "" : t.prefix + "/";
  // Objects by their "directory" (the key up to its last '/').
  std::map<std::string, std::vector<storage::ObjectInfo>> dirs;
  for (storage::ObjectInfo& o : storage::ListAll(*t.store, t.bucket, root)) {
    const auto slash = o.key.rfind('/');
    dirs[slash == std::string::npos ? "" : o.key.substr(0, slash + 1)].push_back(std::move(o));
  }
  std::vector<std::string> doomed, probes;
  for (const auto& [dir, objects] : dirs) {
    std::optional<std::set<std::string>> named;
    const bool committed = std::any_of(objects.begin(), objects.end(),
                                       [&](const storage::ObjectInfo& o) { return o.key == dir + names::kMetadataFile; });
    for (const storage::ObjectInfo& o : objects) {
      const std::string name = o.key.substr(dir.size());
      if (!OlderThan(o.last_modified, grace_seconds, now)) continue;
      if (IsProbeObjectName(name)) {
        probes.push_back(o.key);
        continue;
      }
      if (!IsSaveObjectName(name)) continue;
      if (committed && !named) {
        named = NamedFiles(*t.store, t.bucket, dir + names::kMetadataFile);
        if (!named) named.emplace();  // pruned meanwhile: nothing is named
      }
      if (named && named->count(name)) continue;
      doomed.push_back(o.key);
    }
  }
  std::size_t removed = doomed.size();
  // Re-check each directory's metadata.json just before deleting: a commit since the
  // listing may name what looked unnamed (it would be younger than the grace period
  // only if its objects were; this closes the window for slow commits all the same).
  std::vector<std::string> confirmed;
  std::map<std::string, std::optional<std::set<std::string>>> recheck;
  for (const std::string& key : doomed) {
    const auto slash = key.rfind('/');
    const std::string dir = slash == std::string::npos ? "" : key.substr(0, slash + 1);
    auto it = recheck.find(dir);
    if (it == recheck.end()) it = recheck.emplace(dir, NamedFiles(*t.store, t.bucket, dir + names::kMetadataFile)).first;
    if (it->second && it->second->count(key.substr(dir.size()))) {
      --removed;
      continue;
    }
    confirmed.push_back(key);
  }
  removed += probes.size();
  confirmed.insert(confirmed.end(), probes.begin(), probes.end());
  if (!confirmed.empty()) t.store->DeleteBatch(t.bucket, confirmed);
  for (const storage::MultipartUploadInfo& u : t.store->ListMultipartUploads(t.bucket, root)) {
    const auto slash = u.key.rfind('/');
    const std::string name = slash == std::string::npos ? u.key : u.key.substr(slash + 1);
    if (!IsSaveObjectName(name) || !OlderThan(u.initiated, grace_seconds, now)) continue;
    try {
      t.store->AbortMultipart(t.bucket, u.key, u.upload_id);
      ++removed;
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kNotFound) throw;  // finished or aborted meanwhile
    }
  }
  return removed;
}

fs::path StagingRoot(const ObjectStoreOptions& o) {
  if (!o.staging_dir.empty()) return o.staging_dir;
  const char* tmp = std::getenv("TMPDIR");
  return fs::path(tmp && *tmp ? tmp : "/tmp") / "ckpt-s3-staging";
}

// A save's local staging directory under the staging root: "<nonce>-r<rank>",
// "<nonce>-writer" or "<nonce>-publish" (LocalStaging); a Load's download cache:
// "load-<nonce>-r<rank>" (DownloadToCache).
bool IsStagingName(std::string name) {
  if (name.rfind("load-", 0) == 0) name.erase(0, 5);
  if (name.size() < 18 || name[16] != '-' || !std::all_of(name.begin(), name.begin() + 16, IsHex)) return false;
  const std::string tag = name.substr(17);
  if (tag == "writer" || tag == "publish") return true;
  return tag.size() > 1 && tag[0] == 'r' && std::all_of(tag.begin() + 1, tag.end(), [](char c) { return c >= '0' && c <= '9'; });
}

// Removes the staging directories under `root` that no live save holds (each save keeps a
// shared flock on its own while it lives, LocalStaging; the kernel drops it when the process
// dies, SIGKILL included) and that were last changed at least `grace_seconds` ago. Best effort.
void CleanStaging(const fs::path& root, int64_t grace_seconds) {
  std::error_code ec;
  fs::directory_iterator it(root, ec);
  if (ec) return;
  const std::time_t now = std::time(nullptr);
  for (const fs::directory_entry& e : it) {
    const std::string name = e.path().filename().string();
    if (!IsStagingName(name)) continue;
    const int fd = ::open(e.path().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    if (fd < 0) continue;
    struct stat st {};
    if (::fstat(fd, &st) == 0 && now - st.st_mtime >= grace_seconds && ::flock(fd, LOCK_EX | LOCK_NB) == 0) {
      storage::RemoveAllQuietly(e.path());  // its owner is gone: nobody holds the lock
    }
    ::close(fd);
  }
}

// Makes `dir` and flock's it (the fd returned, to be closed when the directory is done with:
// CleanStaging, LOCK_EX | LOCK_NB, removes it only once nobody holds it). Shared, not
// exclusive: a writer staging its output inside (a publish's merge: storage::BeginStaging
// locks its parent shared) must not wait on it: flocks of two descriptors conflict within
// one process too. A cleaner that removed it between the two (it was not locked yet) makes us start
// again: the lock must be on the directory at `dir`.
int MakeLockedStaging(const fs::path& dir) {
  for (int attempt = 0;; ++attempt) {
    storage::MakeDirs(dir);
    const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC | O_NOFOLLOW);
    struct stat locked {}, now {};
    if (fd >= 0 && ::flock(fd, LOCK_SH) == 0 && ::fstat(fd, &locked) == 0 && ::stat(dir.c_str(), &now) == 0 &&
        locked.st_ino == now.st_ino && locked.st_dev == now.st_dev) {
      return fd;
    }
    if (fd >= 0) ::close(fd);
    if (attempt >= 8) throw Error(ErrorCode::kIO, dir.string() + ": cannot make and lock the staging directory");
  }
}

}  // namespace

storage::s3::S3Options ToS3Options(const ObjectStoreOptions& o) {
  storage::s3::S3Options s;
  s.endpoint = o.endpoint;
  s.region = o.region;
  s.profile = o.profile;
  s.access_key_id = o.access_key_id;
  s.secret_access_key = o.secret_access_key;
  s.session_token = o.session_token;
  s.ca_bundle = o.ca_bundle;
  if (o.addressing == "auto" || o.addressing.empty()) {
    s.addressing = storage::s3::Addressing::kAuto;
  } else if (o.addressing == "path") {
    s.addressing = storage::s3::Addressing::kPath;
  } else if (o.addressing == "virtual") {
    s.addressing = storage::s3::Addressing::kVirtual;
  } else {
    throw Error(ErrorCode::kInvalidArgument,
                "ObjectStoreOptions::addressing: '" + o.addressing + "' is none of auto, path, virtual");
  }
  if (o.max_attempts < 1) throw Error(ErrorCode::kInvalidArgument, "ObjectStoreOptions::max_attempts must be >= 1");
  s.max_attempts = o.max_attempts;
  s.max_connections = std::max(16, o.upload_concurrency);
  return s;
}

struct ObjectSave::Impl {
  Target target;
  ObjectStoreOptions options;
  storage::UploadOptions upload;
  std::optional<std::string> expected_etag;
  fs::path staging;
  int staging_lock = -1;  // the staging directory, flock'ed while this save lives
  std::vector<std::string> uploaded;  // keys
  // Uploads begun while their files are written (StreamUpload), by name; destroyed before
  // the store they use (declared after `target`): an unfinished one is aborted.
  std::map<std::string, std::unique_ptr<storage::StreamingUpload>> streams;
};

ObjectSave::ObjectSave(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

ObjectSave::~ObjectSave() {
  if (impl_ && !impl_->staging.empty()) storage::RemoveAllQuietly(impl_->staging);
  if (impl_ && impl_->staging_lock >= 0) ::close(impl_->staging_lock);
}

std::unique_ptr<ObjectSave> ObjectSave::Begin(const std::string& url, const ObjectStoreOptions& options,
                                              bool overwrite) {
  if (options.leftover_grace_seconds < 0) {
    throw Error(ErrorCode::kInvalidArgument, "ObjectStoreOptions::leftover_grace_seconds must be >= 0");
  }
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->upload = ToUploadOptions(options);
  impl->target = Open(url, options, /*need_prefix=*/true);
  Target& t = impl->target;
  if (!options.single_writer) {
    const std::string probed = t.endpoint + " " + t.bucket;
    bool known;
    {
      std::lock_guard lock(g_mu);
      known = g_probed.count(probed) > 0;
    }
    if (!known) {
      const storage::ConditionalPutProbe probe = storage::ProbeConditionalPut(*t.store, t.bucket, t.Key(".ckpt-probe-"));
      if (!probe.honoured) {
        throw Error(ErrorCode::kInvalidArgument,
                    url + ": the store does not honour conditional PUT (" + probe.detail +
                        "), so two writers could both commit; refusing to save (set ObjectStoreOptions::single_writer "
                        "if only one writer ever saves here)");
      }
      std::lock_guard lock(g_mu);
      g_probed.insert(probed);
    }
  }
  impl->expected_etag = storage::CommittedEtag(*t.store, t.bucket, t.prefix);
  if (impl->expected_etag && !overwrite) {
    throw Error(ErrorCode::kAlreadyExists, url + ": a checkpoint is already there (pass overwrite to replace it)");
  }
  // The leftovers of earlier saves here (losers, killed writers, replaced checkpoints'
  // objects). Best effort: a cleaning that fails (say, an unreadable metadata.json beside
  // old objects) must not stop the save; the next one tries again.
  try {
    CleanTarget(t, options.leftover_grace_seconds);
  } catch (const std::exception&) {
  }
  auto save = std::unique_ptr<ObjectSave>(new ObjectSave(std::move(impl)));
  save->nonce_ = storage::SaveNonce();
  return save;
}

std::unique_ptr<ObjectSave> ObjectSave::Join(const std::string& url, const ObjectStoreOptions& options,
                                             const std::string& nonce) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->upload = ToUploadOptions(options);
  impl->target = Open(url, options, /*need_prefix=*/true);
  if (nonce.size() != 16 || !std::all_of(nonce.begin(), nonce.end(), IsHex)) {
    throw Error(ErrorCode::kComm, url + ": the save's nonce from rank 0 is malformed");
  }
  auto save = std::unique_ptr<ObjectSave>(new ObjectSave(std::move(impl)));
  save->nonce_ = nonce;
  return save;
}

std::string ObjectSave::ObjectName(const std::string& file) const {
  // A name that carries an earlier save's nonce (a checkpoint downloaded from a store and
  // published again) gets this one's instead of a second.
  if (IsSaveObjectName(file)) return storage::UniqueObjectName(file.substr(0, 20) + ".h5", nonce_);
  return storage::UniqueObjectName(file, nonce_);
}

const fs::path& ObjectSave::LocalStaging(const std::string& tag) {
  if (impl_->staging.empty()) {
    const fs::path root = StagingRoot(impl_->options);
    storage::MakeDirs(root);
    // What killed saves left here (their locks died with them).
    CleanStaging(root, impl_->options.leftover_grace_seconds);
    const fs::path dir = root / (nonce_ + "-" + tag);
    impl_->staging_lock = MakeLockedStaging(dir);
    impl_->staging = dir;
  }
  return impl_->staging;
}

std::function<void(uint64_t, uint64_t)> ObjectSave::StreamUpload(const std::string& name) {
  const Target& t = impl_->target;
  auto& stream = impl_->streams[name];
  stream = std::make_unique<storage::StreamingUpload>(*t.store, t.bucket, t.Key(name), impl_->staging / name,
                                                      impl_->upload);
  return [up = stream.get()](uint64_t offset, uint64_t n) { up->Final(offset, n); };
}

void ObjectSave::Upload(const std::string& name) {
  const fs::path path = impl_->staging / name;
  struct Remove {
    const fs::path& p;
    ~Remove() { storage::RemoveAllQuietly(p); }
  } remove{path};
  const auto stream = impl_->streams.find(name);
  if (stream == impl_->streams.end()) return UploadFrom(path, name);
  impl_->uploaded.push_back(impl_->target.Key(name));  // an upload that fails half-way may still have made it
  std::unique_ptr<storage::StreamingUpload> up = std::move(stream->second);
  impl_->streams.erase(stream);
  up->Finish();
}

void ObjectSave::UploadFrom(const fs::path& path, const std::string& name) {
  const Target& t = impl_->target;
  const std::string key = t.Key(name);
  impl_->uploaded.push_back(key);  // an upload that fails half-way may still have made it
  storage::UploadFile(*t.store, t.bucket, key, path, impl_->upload);
}

void ObjectSave::Commit(const Metadata& m) {
  const Target& t = impl_->target;
  std::vector<std::string> keys;
  for (const FileMeta& f : m.files) keys.push_back(t.Key(f.name));
  const std::string text = SerializeMetadata(m);
  const std::string key = t.Key(names::kMetadataFile);
  const storage::ByteSpan body = storage::s3::AsBytes(text);
  const std::optional<std::string> etag = impl_->expected_etag ? t.store->PutIfMatch(t.bucket, key, body, *impl_->expected_etag)
                                                               : t.store->PutIfAbsent(t.bucket, key, body);
  if (etag) return;
  // Lost: nothing of this save is named by a checkpoint; its objects go now.
  try {
    t.store->DeleteBatch(t.bucket, keys);
  } catch (const std::exception&) {  // left for CleanLeftovers
  }
  throw Error(ErrorCode::kAlreadyExists,
              t.Url(names::kMetadataFile) + ": another writer committed first (" +
                  (impl_->expected_etag ? "metadata.json is no longer the one with ETag " + *impl_->expected_etag +
                                              " seen when this save began"
                                        : std::string("metadata.json exists now")) +
                  "); nothing of this save was committed");
}

void ObjectSave::DiscardUploads() noexcept {
  if (impl_->uploaded.empty()) return;
  try {
    impl_->target.store->DeleteBatch(impl_->target.bucket, impl_->uploaded);
    impl_->uploaded.clear();
  } catch (const std::exception&) {  // left for CleanLeftovers
  }
}

std::size_t CleanObjectLeftovers(const std::string& url, const ObjectStoreOptions& options) {
  if (options.leftover_grace_seconds < 0) {
    throw Error(ErrorCode::kInvalidArgument, "ObjectStoreOptions::leftover_grace_seconds must be >= 0");
  }
  CleanStaging(StagingRoot(options), options.leftover_grace_seconds);
  return CleanTarget(Open(url, options, /*need_prefix=*/false), options.leftover_grace_seconds);
}

std::vector<std::string> ListCommittedObjects(const std::string& url, const ObjectStoreOptions& options) {
  const Target t = Open(url, options, /*need_prefix=*/false);
  const std::string root = t.prefix.empty() ? "" : t.prefix + "/";
  std::vector<std::string> out;
  for (const storage::ObjectInfo& o : storage::ListAll(*t.store, t.bucket, root)) {
    const std::string rest = o.key.substr(root.size());
    const auto slash = rest.find('/');
    if (slash != std::string::npos && slash > 0 && rest.substr(slash + 1) == names::kMetadataFile) {
      out.push_back(rest.substr(0, slash));
    }
  }
  return out;
}

void RemoveObjectCheckpoint(const std::string& url, const ObjectStoreOptions& options) {
  const Target t = Open(url, options, /*need_prefix=*/true);
  const std::string key = t.Key(names::kMetadataFile);
  const auto named = NamedFiles(*t.store, t.bucket, key);
  if (!named) return;
  t.store->DeleteBatch(t.bucket, {key});  // un-committed first: a reader now gets an error, never a mix
  std::vector<std::string> keys;
  for (const std::string& n : *named) keys.push_back(t.Key(n));
  t.store->DeleteBatch(t.bucket, keys);
}

void ThrowIfCommitChanged(storage::ObjectStore& store, const std::string& bucket, const std::string& metadata_key,
                          const std::string& url, uint64_t text_hash, const Error& e) {
  std::string now;
  bool gone = false;
  try {
    const std::vector<std::byte> body = store.Get(bucket, metadata_key, kMaxMetadataBytes);
    now.assign(reinterpret_cast<const char*>(body.data()), body.size());
  } catch (const Error& again) {
    if (again.code() != ErrorCode::kNotFound) return;  // cannot tell: the first error stands
    gone = true;
  }
  if (!gone && std::hash<std::string>{}(now) == text_hash) return;
  throw Error(ErrorCode::kChanged, url + ": changed while reading: metadata.json was " +
                                       (gone ? "removed" : "replaced by another commit") +
                                       " after this read began, and the objects of the version being read are going (" +
                                       e.what() + "); load again");
}

void DownloadObjectCheckpoint(const std::string& url, const ObjectStoreOptions& options, const fs::path& dir,
                              uint64_t max_bytes) {
  const Target t = Open(url, options, /*need_prefix=*/true);
  const std::string key = t.Key(names::kMetadataFile);
  const std::vector<std::byte> body = t.store->Get(t.bucket, key, kMaxMetadataBytes);
  const std::string text(reinterpret_cast<const char*>(body.data()), body.size());
  const Metadata m = ParseMetadata(text, t.Url(names::kMetadataFile));
  uint64_t total = 0;  // saturating: absurd sizes must not wrap below the bound
  for (const FileMeta& f : m.files) total = f.bytes > UINT64_MAX - total ? UINT64_MAX : total + f.bytes;
  if (total > max_bytes) {
    throw Error(ErrorCode::kInvalidArgument, url + ": its files hold " + std::to_string(total) +
                                                 " bytes, more than the " + std::to_string(max_bytes) + " allowed here");
  }
  storage::MakeDirs(dir);
  constexpr uint64_t kPiece = 8ull << 20;
  std::vector<std::byte> buf;
  for (const FileMeta& f : m.files) {
    const fs::path path = dir / f.name;
    storage::Fd fd = storage::OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC);
    for (uint64_t off = 0; off < f.bytes; off += kPiece) {
      buf.resize(static_cast<std::size_t>(std::min(kPiece, f.bytes - off)));
      try {
        t.store->GetRange(t.bucket, t.Key(f.name), off, buf);
      } catch (const Error& e) {  // the object gone (404) or shorter: replaced and collected meanwhile?
        if (e.code() == ErrorCode::kNotFound || e.code() == ErrorCode::kIO) {
          ThrowIfCommitChanged(*t.store, t.bucket, key, url, std::hash<std::string>{}(text), e);
        }
        throw;
      }
      storage::WriteExact(fd.get(), buf.data(), buf.size(), off, path);
    }
  }
  storage::WriteFileSynced(dir / names::kMetadataFile, text);
}

CacheDir::~CacheDir() {
  if (!path_.empty()) storage::RemoveAllQuietly(path_);
  if (lock_ >= 0) ::close(lock_);
}

std::unique_ptr<CacheDir> DownloadToCache(const std::string& url, const ObjectStoreOptions& options, int rank) {
  const fs::path root = StagingRoot(options);
  CleanStaging(root, options.leftover_grace_seconds);  // what killed saves and loads left
  const fs::path dir = root / ("load-" + storage::SaveNonce() + "-r" + std::to_string(rank));
  // Locked while this load lives, as a save's staging: a killed load's is collected.
  auto cache = std::unique_ptr<CacheDir>(new CacheDir(dir, MakeLockedStaging(dir)));
  DownloadObjectCheckpoint(url, options, dir, options.cache_max_bytes);  // on error, ~CacheDir
  return cache;
}

std::shared_ptr<storage::ObjectStore> OpenObjectStore(const ObjectStoreOptions& options, const std::string& url) {
  return OpenStore(options, nullptr, url);
}

void SetObjectStoreWrapperForTest(
    std::function<std::shared_ptr<storage::ObjectStore>(std::shared_ptr<storage::ObjectStore>)> wrap) {
  std::lock_guard lock(g_mu);
  g_wrap = std::move(wrap);
  g_probed.clear();
}

#endif  // CKPT_HAVE_S3

}  // namespace ckpt::internal
