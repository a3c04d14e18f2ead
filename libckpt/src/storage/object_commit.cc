#include "storage/object_commit.h"

#include <algorithm>
#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <deque>
#include <exception>
#include <mutex>
#include <random>
#include <set>
#include <system_error>
#include <thread>

#include "ckpt/error.h"
#include "storage/fs.h"
#include "storage/s3_sign.h"

namespace ckpt::storage {
namespace {

constexpr uint64_t kMinPartBytes = 5ull << 20;
constexpr std::size_t kMaxParts = 10000;
constexpr uint64_t kMaxMetadataBytes = 1ull << 30;
constexpr const char* kMetadata = "metadata.json";

std::string Join(const std::string& prefix, const std::string& name) {
  if (prefix.empty() || prefix.back() == '/') return prefix + name;
  return prefix + "/" + name;
}

std::string Url(const std::string& bucket, const std::string& key) { return "s3://" + bucket + "/" + key; }

// One multipart upload in progress: its id, and each part's MD5 once sent.
struct Upload {
  std::string key;
  std::filesystem::path path;
  uint64_t size = 0;
  std::string id;
  std::vector<CompletedPart> parts;
};

// Runs fn(i) for i in [0, n) on up to `parallel` threads; the first exception is rethrown
// after all have stopped (the others skip the tasks left).
template <typename Fn>
void ParallelFor(std::size_t n, int parallel, Fn fn) {
  std::atomic<std::size_t> next{0};
  std::atomic<bool> failed{false};
  std::exception_ptr error;
  std::mutex mu;
  const auto work = [&] {
    for (std::size_t i; !failed && (i = next++) < n;) {
      try {
        fn(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        failed = true;
      }
    }
  };
  const std::size_t threads = std::min<std::size_t>(n, static_cast<std::size_t>(std::max(parallel, 1)));
  std::vector<std::thread> pool;
  for (std::size_t t = 1; t < threads; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

void CheckOptions(const UploadOptions& o) {
  if (o.part_bytes < kMinPartBytes || o.part_bytes > (5ull << 30) || o.parallel < 1) {
    throw Error(ErrorCode::kInvalidArgument, "upload options: part_bytes must be 5 MiB..5 GiB and parallel >= 1");
  }
}

// Buffers for parts in flight, reused from part to part (a new 16 MiB buffer per part cost a
// page fault and a cleared page per 4 KiB: about a tenth of a save's client CPU). Memory:
// one buffer per thread sending.
class PartBuffers {
 public:
  // Reads `n` bytes at `offset` of `fd` (the file at `path`) and sends them as part `number`
  // of upload `id`: the part's ETag.
  std::string Send(ObjectStore& store, const std::string& bucket, const std::string& key, const std::string& id,
                   int number, int fd, uint64_t offset, std::size_t n, const std::filesystem::path& path) {
    std::vector<std::byte> buf;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!free_.empty()) {
        buf = std::move(free_.back());
        free_.pop_back();
      }
    }
    buf.resize(n);
    ReadExact(fd, buf.data(), n, offset, path);
    std::string etag = store.UploadPart(bucket, key, id, number, buf);
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back(std::move(buf));
    return etag;
  }

 private:
  std::mutex mu_;
  std::vector<std::vector<std::byte>> free_;
};

// Uploads every file of `uploads` (multipart), its parts spread over `parallel` threads.
void UploadMultipart(ObjectStore& store, const std::string& bucket, std::vector<Upload>& uploads,
                     const UploadOptions& options) {
  struct Task {
    std::size_t upload;
    int part;
  };
  std::vector<Task> tasks;
  try {
    for (std::size_t u = 0; u < uploads.size(); ++u) {
      Upload& up = uploads[u];
      const uint64_t parts = (up.size + options.part_bytes - 1) / options.part_bytes;
      if (parts > 10000) {
        throw Error(ErrorCode::kInvalidArgument, up.path.string() + ": " + std::to_string(up.size) +
                                                     " bytes need more than S3's 10000 parts of " +
                                                     std::to_string(options.part_bytes));
      }
      up.parts.resize(parts);
      up.id = store.CreateMultipart(bucket, up.key);
      for (uint64_t p = 0; p < parts; ++p) tasks.push_back({u, static_cast<int>(p + 1)});
    }
    // Each thread reads one part into a buffer of its own: memory is parallel * part_bytes.
    std::vector<Fd> fds;
    for (const Upload& up : uploads) fds.push_back(OpenRegularFile(up.path));
    PartBuffers buffers;
    ParallelFor(tasks.size(), options.parallel, [&](std::size_t i) {
      const Task& t = tasks[i];
      Upload& up = uploads[t.upload];
      const uint64_t offset = static_cast<uint64_t>(t.part - 1) * options.part_bytes;
      const std::size_t n = static_cast<std::size_t>(std::min(options.part_bytes, up.size - offset));
      up.parts[static_cast<std::size_t>(t.part - 1)] = {
          t.part, buffers.Send(store, bucket, up.key, up.id, t.part, fds[t.upload].get(), offset, n, up.path)};
    });
    for (Upload& up : uploads) {
      store.CompleteMultipart(bucket, up.key, up.id, up.parts);
      up.id.clear();
    }
  } catch (...) {
    for (const Upload& up : uploads) {
      if (up.id.empty()) continue;
      try {
        store.AbortMultipart(bucket, up.key, up.id);
      } catch (const std::exception&) {  // left for the leftovers cleaning
      }
    }
    throw;
  }
}

// HEAD after upload: the size, and the ETag the parts make (MD5 for one part sent by PUT).
ObjectInfo Verify(ObjectStore& store, const std::string& bucket, const std::string& key, uint64_t size,
                  const std::string& etag) {
  const auto info = store.Head(bucket, key);
  if (!info) throw Error(ErrorCode::kIO, Url(bucket, key) + ": not there after its upload completed");
  if (info->size != size || info->etag != etag) {
    throw Error(ErrorCode::kIO, Url(bucket, key) + ": after upload the object has " + std::to_string(info->size) +
                                    " bytes, ETag " + info->etag + "; sent " + std::to_string(size) + " bytes, ETag " +
                                    etag);
  }
  return *info;
}

}  // namespace

std::string SaveNonce() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(rng()));
  return buf;
}

std::string UniqueObjectName(const std::string& name, const std::string& nonce) {
  const auto dot = name.rfind('.');
  if (dot == std::string::npos || dot == 0) return name + "." + nonce;
  return name.substr(0, dot) + "." + nonce + name.substr(dot);
}

ObjectInfo UploadFile(ObjectStore& store, const std::string& bucket, const std::string& key,
                      const std::filesystem::path& path, const UploadOptions& options) {
  return StreamingUpload(store, bucket, key, path, options).Finish();
}

struct StreamingUpload::Impl {
  ObjectStore& store;
  const std::string bucket, key;
  const std::filesystem::path path;
  const UploadOptions options;
  PartBuffers buffers;

  std::mutex create_mu;  // held while the multipart upload is created
  std::string id;        // the multipart upload's, once created; cleared once completed

  std::mutex mu;
  std::condition_variable cv;
  std::vector<uint64_t> covered;             // final bytes reported, per part
  std::deque<std::size_t> ready;             // parts made only of final bytes, not yet taken
  std::vector<CompletedPart> sent;           // by part index; number 0: not sent
  std::size_t in_flight = 0, early = 0;
  bool stopping = false;
  std::exception_ptr error;
  std::vector<std::thread> workers;
  Fd fd;  // opened by the first part read (the file exists by then)

  Impl(ObjectStore& s, std::string b, std::string k, std::filesystem::path p, const UploadOptions& o)
      : store(s), bucket(std::move(b)), key(std::move(k)), path(std::move(p)), options(o) {}

  const std::string& Id() {
    std::lock_guard<std::mutex> lock(create_mu);
    if (id.empty()) id = store.CreateMultipart(bucket, key);
    return id;
  }

  int File() {
    std::lock_guard<std::mutex> lock(create_mu);
    if (!fd) fd = OpenRegularFile(path);
    return fd.get();
  }

  // Sends part `k` (0-based) of `n` bytes.
  void SendPart(std::size_t k, std::size_t n) {
    const std::string& upload = Id();
    const int number = static_cast<int>(k + 1);
    std::string etag =
        buffers.Send(store, bucket, key, upload, number, File(), static_cast<uint64_t>(k) * options.part_bytes, n, path);
    std::lock_guard<std::mutex> lock(mu);
    if (sent.size() <= k) sent.resize(k + 1);
    sent[k] = {number, std::move(etag)};
  }

  void Work() {
    std::unique_lock<std::mutex> lock(mu);
    for (;;) {
      cv.wait(lock, [&] { return !ready.empty() || stopping; });
      if (stopping || error) return;
      const std::size_t k = ready.front();
      ready.pop_front();
      ++in_flight;
      lock.unlock();
      std::exception_ptr failed;
      try {
        SendPart(k, static_cast<std::size_t>(options.part_bytes));
      } catch (...) {
        failed = std::current_exception();
      }
      lock.lock();
      --in_flight;
      ++early;
      if (failed && !error) error = failed;
      cv.notify_all();
    }
  }

  void Stop() {
    {
      std::lock_guard<std::mutex> lock(mu);
      stopping = true;
    }
    cv.notify_all();
    for (std::thread& t : workers) t.join();
    workers.clear();
  }
};

StreamingUpload::StreamingUpload(ObjectStore& store, std::string bucket, std::string key, std::filesystem::path path,
                                 const UploadOptions& options)
    : impl_(std::make_unique<Impl>(store, std::move(bucket), std::move(key), std::move(path), options)) {
  CheckOptions(options);
}

StreamingUpload::~StreamingUpload() {
  impl_->Stop();
  if (impl_->id.empty()) return;
  try {
    impl_->store.AbortMultipart(impl_->bucket, impl_->key, impl_->id);
  } catch (const std::exception&) {  // left for the leftovers cleaning
  }
}

void StreamingUpload::Final(uint64_t offset, uint64_t n) {
  Impl& m = *impl_;
  const uint64_t part = m.options.part_bytes;
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.stopping || m.error) return;
  bool queued = false;
  for (uint64_t at = offset, end = offset + n; at < end;) {
    const std::size_t k = static_cast<std::size_t>(at / part);
    const uint64_t upto = std::min(end, (k + 1) * part);
    if (k >= kMaxParts) return;  // Finish refuses the file
    if (m.covered.size() <= k) m.covered.resize(k + 1);
    m.covered[k] += upto - at;
    if (m.covered[k] == part) {
      m.ready.push_back(k);
      queued = true;
    }
    at = upto;
  }
  if (!queued) return;
  const std::size_t busy = m.in_flight + m.ready.size();
  if (m.workers.size() < static_cast<std::size_t>(m.options.parallel) && m.workers.size() < busy) {
    try {
      m.workers.emplace_back([&m] { m.Work(); });
    } catch (const std::system_error&) {  // no thread: the parts wait for Finish's threads
      if (m.workers.empty()) m.ready.clear();
    }
  }
  m.cv.notify_one();
}

std::size_t StreamingUpload::early_parts() const {
  std::lock_guard<std::mutex> lock(impl_->mu);
  return impl_->early;
}

ObjectInfo StreamingUpload::Finish() {
  Impl& m = *impl_;
  {
    std::unique_lock<std::mutex> lock(m.mu);
    m.cv.wait(lock, [&] { return (m.ready.empty() && m.in_flight == 0) || m.error; });
  }
  m.Stop();
  if (m.error) std::rethrow_exception(m.error);
  const uint64_t size = FileSize(m.File(), m.path);
  const uint64_t part = m.options.part_bytes;
  if (size <= part && m.id.empty()) {  // one PUT
    std::vector<std::byte> body(static_cast<std::size_t>(size));
    ReadExact(m.File(), body.data(), body.size(), 0, m.path);
    const auto etag = m.store.PutIfAbsent(m.bucket, m.key, body);
    if (!etag) {
      throw Error(ErrorCode::kAlreadyExists, Url(m.bucket, m.key) + ": exists already (uploading " + m.path.string() + ")");
    }
    return Verify(m.store, m.bucket, m.key, size, *etag);
  }
  const uint64_t parts = std::max<uint64_t>(1, (size + part - 1) / part);
  if (parts > kMaxParts) {
    throw Error(ErrorCode::kInvalidArgument, m.path.string() + ": " + std::to_string(size) +
                                                 " bytes need more than S3's 10000 parts of " + std::to_string(part));
  }
  if (m.sent.size() > parts) {
    throw Error(ErrorCode::kInternal, m.path.string() + ": a part past the file's end was reported final");
  }
  m.sent.resize(static_cast<std::size_t>(parts));
  std::vector<std::size_t> left;
  for (std::size_t k = 0; k < m.sent.size(); ++k) {
    if (m.sent[k].number == 0) left.push_back(k);
  }
  ParallelFor(left.size(), m.options.parallel, [&](std::size_t i) {
    const std::size_t k = left[i];
    m.SendPart(k, static_cast<std::size_t>(std::min(part, size - k * part)));
  });
  m.store.CompleteMultipart(m.bucket, m.key, m.Id(), m.sent);
  m.id.clear();
  std::vector<std::string> md5s;
  for (const CompletedPart& p : m.sent) md5s.push_back(p.etag);
  return Verify(m.store, m.bucket, m.key, size, s3::MultipartEtag(md5s));
}

std::optional<std::string> CommittedEtag(ObjectStore& store, const std::string& bucket, const std::string& prefix) {
  const auto info = store.Head(bucket, Join(prefix, kMetadata));
  if (!info) return std::nullopt;
  return info->etag;
}

std::string PublishDirectory(ObjectStore& store, const std::filesystem::path& dir, const std::string& bucket,
                             const std::string& prefix, const std::optional<std::string>& expected_etag,
                             const UploadOptions& options) {
  CheckOptions(options);
  std::vector<std::string> names;
  if (Fs().ListDir(dir, names) != 0) {
    throw Error(ErrorCode::kIO, dir.string() + ": cannot list the staged checkpoint");
  }
  std::sort(names.begin(), names.end());
  if (std::find(names.begin(), names.end(), kMetadata) == names.end()) {
    throw Error(ErrorCode::kInvalidArgument, dir.string() + ": no metadata.json in the staged checkpoint");
  }
  // Names unique to the save never collide with what is there; one that does is refused
  // before anything is written (a committed checkpoint's objects are never touched).
  std::set<std::string> existing;
  for (const ObjectInfo& o : ListAll(store, bucket, Join(prefix, ""))) existing.insert(o.key);
  std::vector<Upload> multipart;
  std::vector<std::pair<std::string, std::filesystem::path>> single;
  for (const std::string& name : names) {
    if (name == kMetadata) continue;
    const std::string key = Join(prefix, name);
    if (existing.count(key)) {
      throw Error(ErrorCode::kAlreadyExists, Url(bucket, key) + ": exists already: a save writes only names unique to it");
    }
    const std::filesystem::path path = dir / name;
    Fd fd = OpenRegularFile(path);
    const uint64_t size = FileSize(fd.get(), path);
    if (size > options.part_bytes) {
      multipart.push_back({key, path, size, "", {}});
    } else {
      single.emplace_back(key, path);
    }
  }
  // Small files first, in parallel, then the large ones' parts, all parallel.
  ParallelFor(single.size(), options.parallel,
              [&](std::size_t i) { UploadFile(store, bucket, single[i].first, single[i].second, options); });
  UploadMultipart(store, bucket, multipart, options);
  for (const Upload& up : multipart) {
    std::vector<std::string> md5s;
    for (const CompletedPart& p : up.parts) md5s.push_back(p.etag);
    Verify(store, bucket, up.key, up.size, s3::MultipartEtag(md5s));
  }

  // The commit: one conditional PUT of metadata.json.
  const std::string metadata = ReadFileLimited(dir / kMetadata, kMaxMetadataBytes);
  const std::string key = Join(prefix, kMetadata);
  const ByteSpan body = s3::AsBytes(metadata);
  const auto etag = expected_etag ? store.PutIfMatch(bucket, key, body, *expected_etag)
                                  : store.PutIfAbsent(bucket, key, body);
  if (!etag) {
    throw Error(ErrorCode::kAlreadyExists,
                Url(bucket, key) + ": another writer committed first (" +
                    (expected_etag ? "metadata.json is no longer the one with ETag " + *expected_etag + " seen at the start"
                                   : std::string("metadata.json exists now")) +
                    "); this save's objects are not named by any checkpoint");
  }
  return *etag;
}

}  // namespace ckpt::storage
