// Reading checkpoints from the real gateway without HDF5 (checkpoint/object_read.h): a
// checkpoint saved locally is uploaded object by object, then loaded from s3:// with 1, 4 and
// (resharded) 3 ranks, every byte equal to the local load; a resharded load fetches only the
// blocks it needs (counted by a store that wraps the real one); a flipped byte in an object,
// a metadata.json naming an object outside the prefix, one without the index's place, and a
// server answering another range are all refused with errors naming what is wrong.
#include <doctest/doctest.h>

#include <atomic>
#include <cstring>
#include <fstream>
#include <sstream>

#include "checkpoint/object_read.h"
#include "ckpt/checkpoint.h"
#include "ckpt/verify.h"
#include "ckpt/comm.h"
#include "error_of.h"
#include "fault_proxy.h"
#include "forwarding_store.h"
#include "s3_gateway.h"
#include "storage/s3_sign.h"
#include "storage/s3_store.h"
#include "test_util.h"

using namespace ckpt;
using s3_test::ErrorOf;
namespace fs = std::filesystem;
namespace st = ckpt::storage;

namespace {

constexpr int64_t kRows = 1200, kCols = 1024;  // model.w: float32, 4 KiB a row, 4.9 MB
constexpr int64_t kSmall = 100;               // small.b: float32, 100 B per rank: packed

// The real store, counting what ranged and whole GETs return.
class CountingStore : public s3_test::ForwardingStore {
 public:
  using ForwardingStore::ForwardingStore;
  std::atomic<uint64_t> bytes{0}, gets{0};

  void GetRange(const std::string& b, const std::string& k, uint64_t offset, std::span<std::byte> out) override {
    ForwardingStore::GetRange(b, k, offset, out);
    bytes += out.size();
    ++gets;
  }
  std::vector<std::byte> Get(const std::string& b, const std::string& k, uint64_t max_bytes) override {
    auto body = ForwardingStore::Get(b, k, max_bytes);
    bytes += body.size();
    ++gets;
    return body;
  }
};

// Sets the store s3:// reads use for the life of the object.
struct UseStore {
  explicit UseStore(std::shared_ptr<st::ObjectStore> s) { internal::SetObjectStoreForTesting(std::move(s)); }
  ~UseStore() { internal::SetObjectStoreForTesting(nullptr); }
};

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Every file of the local checkpoint `dir` as an object under `prefix`; `edit` may change a
// file's bytes on the way.
void Upload(st::ObjectStore& store, const std::string& bucket, const std::string& prefix, const fs::path& dir,
            const std::function<void(const std::string&, std::string&)>& edit = {}) {
  for (const auto& e : fs::directory_iterator(dir)) {
    std::string body = ReadFile(e.path());
    if (edit) edit(e.path().filename().string(), body);
    store.Put(bucket, prefix + "/" + e.path().filename().string(), st::s3::AsBytes(body));
  }
}

float Value(int64_t r, int64_t c) { return static_cast<float>(r * 7919 + c) * 0.25f; }

// Saves model.w row-sharded over 4 ranks, small.b in 4 packed pieces, and a bytes entry.
void SaveLocal(const fs::path& dir, const SaveOptions& options = {}) {
  RunThreads(4, [&](Comm& comm) {
    const int64_t rows = kRows / 4, r0 = rows * comm.rank();
    std::vector<float> w(static_cast<std::size_t>(rows * kCols));
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t c = 0; c < kCols; ++c) w[static_cast<std::size_t>(r * kCols + c)] = Value(r0 + r, c);
    std::vector<float> small(kSmall / 4);
    for (std::size_t i = 0; i < small.size(); ++i) small[i] = static_cast<float>(comm.rank() * 1000 + i);
    StateDict sd;
    sd.Add("model.w", Tensor::Slice(DType::kFloat32, {kRows, kCols}, 0, r0, rows, w.data()));
    sd.Add("small.b", Tensor::Slice(DType::kFloat32, {kSmall}, 0, kSmall / 4 * comm.rank(), kSmall / 4, small.data()));
    if (comm.rank() == 0) sd.Add("blob", Bytes{ckpt_test::RandomBytes(5000, 7)});
    sd.Add("step", Scalar::Int(42));
    Save(dir, sd, comm, options);
  });
}

struct Loaded {
  std::vector<std::vector<float>> w, small;  // per rank
  std::vector<uint8_t> blob;
  uint64_t returned = 0;  // bytes of tensors and blobs the ranks asked for
};

// Loads `path` with `world` ranks, model.w and small.b cut in row slices of near-equal size.
Loaded LoadRanks(const std::string& path, int world, const ObjectStoreOptions& s3 = {}) {
  Loaded out;
  out.w.resize(static_cast<std::size_t>(world));
  out.small.resize(static_cast<std::size_t>(world));
  std::atomic<uint64_t> returned{0};
  RunThreads(world, [&](Comm& comm) {
    const int r = comm.rank();
    const int64_t w0 = kRows * r / world, w1 = kRows * (r + 1) / world;
    const int64_t s0 = kSmall * r / world, s1 = kSmall * (r + 1) / world;
    auto& w = out.w[static_cast<std::size_t>(r)];
    auto& small = out.small[static_cast<std::size_t>(r)];
    w.assign(static_cast<std::size_t>((w1 - w0) * kCols), -1.0f);
    small.assign(static_cast<std::size_t>(s1 - s0), -1.0f);
    StateDict sd;
    sd.Add("model.w", Tensor::Slice(DType::kFloat32, {kRows, kCols}, 0, w0, w1 - w0, w.data()));
    sd.Add("small.b", Tensor::Slice(DType::kFloat32, {kSmall}, 0, s0, s1 - s0, small.data()));
    sd.Add("blob", Bytes{});
    sd.Add("step", Scalar{});
    LoadOptions o;
    o.s3 = s3;
    Load(path, sd, comm, o);
    returned += (w.size() + small.size()) * sizeof(float) + std::get<Bytes>(*sd.Find("blob")).data.size();
    if (r == 0) out.blob = std::get<Bytes>(*sd.Find("blob")).data;
  });
  out.returned = returned;
  return out;
}

// A fresh bucket with the checkpoint saved locally and uploaded under "run/step-1".
struct Fixture : s3_test::StoreFixture {
  fs::path local = tmp / "step-1";
  std::string url = Url("run/step-1");
  Fixture() : StoreFixture("s3read") {
    SaveLocal(local);
    Upload(store, bucket.name(), "run/step-1", local);
  }
  // The options of the gateway, as a caller gives them (they override the environment).
  ObjectStoreOptions Options(const std::string& endpoint = "") const {
    ObjectStoreOptions o = s3_test::GatewayOptions(config);
    if (!endpoint.empty()) o.endpoint = endpoint;
    o.max_attempts = 2;
    return o;
  }
};

}  // namespace

TEST_CASE("Load from s3:// with 1, 4 and 3 (resharded) ranks: the local load's bytes, a reshard fetching <= 1.25x") {
  Fixture f;
  const Metadata md = ReadMetadata(f.local, /*resolve=*/false);
  for (const FileMeta& file : md.files) {
    CHECK_MESSAGE(file.index_bytes > 0, file.name, ": the writer recorded where its index lies");
  }
  auto counting = std::make_shared<CountingStore>(f.s3);
  UseStore use(counting);
  for (const int world : {1, 4, 3}) {
    const Loaded local = LoadRanks(f.local.string(), world);
    counting->bytes = 0;
    counting->gets = 0;
    const Loaded remote = LoadRanks(f.url, world);
    CHECK(remote.w == local.w);
    CHECK(remote.small == local.small);
    CHECK(remote.blob == local.blob);
    CHECK(remote.blob == ckpt_test::RandomBytes(5000, 7));
    CHECK(local.w.back().back() == Value(kRows - 1, kCols - 1));
    const double ratio = static_cast<double>(counting->bytes.load()) / static_cast<double>(remote.returned);
    MESSAGE(world, " ranks from 4: fetched ", counting->bytes.load(), " bytes in ", counting->gets.load(),
            " GETs (metadata.json and indexes included) for ", remote.returned, " returned: ", ratio, "x");
    CHECK(ratio <= 1.25);
  }
}

TEST_CASE("CheckpointReader on s3://: regions, chunks, verification, and no local file to locate") {
  Fixture f;
  auto reader = CheckpointReader::Open(f.url, f.Options());
  CHECK(reader->metadata().Find("model.w"));
  std::vector<float> rows(3 * kCols);
  reader->ReadRegion("model.w", Box{{299, 0}, {3, kCols}}, rows.data(), true);  // across two shards
  for (int64_t r = 0; r < 3; ++r) CHECK(rows[static_cast<std::size_t>(r * kCols + 5)] == Value(299 + r, 5));
  reader->VerifyChunk("model.w", 2);
  CHECK_FALSE(reader->LocateChunk("model.w", 0).has_value());
  CHECK(reader->ReadBytes("blob", true) == ckpt_test::RandomBytes(5000, 7));
  auto resolved = CheckpointReader::Open(f.url, f.Options(), /*resolve=*/true);
  CHECK(resolved->metadata().Find("model.w")->chunks.size() == 4);
}

TEST_CASE("a flipped byte in an object is refused, naming the key, the object and the block") {
  Fixture f;
  // The file offset of model.w's chunk in shard 1, from its (resolved) record.
  const Metadata md = ReadMetadata(f.local, /*resolve=*/true);
  const ChunkMeta* target = nullptr;
  for (const ChunkMeta& c : md.Find("model.w")->chunks)
    if (c.box.offsets[0] == kRows / 4) target = &c;
  REQUIRE(target);
  REQUIRE(target->offset);
  const uint64_t at = *target->offset + 5 * 65536 + 17;  // in block 5
  Upload(*f.s3, f.bucket.name(), "bad/step-1", f.local, [&](const std::string& name, std::string& body) {
    if (name == target->file) body[at] = static_cast<char>(body[at] ^ 0x20);
  });
  const std::string url = "s3://" + f.bucket.name() + "/bad/step-1";
  ErrorCode code{};
  const std::string e = ErrorOf([&] { LoadRanks(url, 1, f.Options()); }, &code);
  CHECK(code == ErrorCode::kCorrupt);
  CHECK_MESSAGE(e.find("model.w") != std::string::npos, e);
  CHECK_MESSAGE(e.find("bad/step-1/" + target->file) != std::string::npos, e);
  CHECK_MESSAGE(e.find("block 5 ") != std::string::npos, e);
  // A region that does not touch the block reads (block 5 holds rows 380..396 of 300..600);
  // one that touches it is refused.
  auto reader = CheckpointReader::Open(url, f.Options());
  std::vector<float> rows(70 * kCols);
  CHECK_NOTHROW(reader->ReadRegion("model.w", Box{{300, 0}, {70, kCols}}, rows.data(), true));
  CHECK(rows[kCols + 3] == Value(301, 3));
  const std::string e2 = ErrorOf([&] { reader->ReadRegion("model.w", Box{{390, 0}, {2, kCols}}, rows.data(), true); });
  CHECK_MESSAGE(e2.find(": block 5 (bytes 327680..393216): checksum mismatch") != std::string::npos, e2);
}

TEST_CASE("metadata.json naming an object outside the prefix, or no index place: refused before any shard GET") {
  Fixture f;
  Metadata md = ReadMetadata(f.local, /*resolve=*/false);
  const auto put = [&](const std::string& prefix, const Metadata& m) {
    f.s3->Put(f.bucket.name(), prefix + "/metadata.json", st::s3::AsBytes(SerializeMetadata(m)));
    return "s3://" + f.bucket.name() + "/" + prefix;
  };
  {
    Metadata m = md;
    m.files[1].name = "../other/" + m.files[1].name;
    const std::string e = ErrorOf([&] { LoadRanks(put("outside", m), 1, f.Options()); });
    CHECK_MESSAGE(e.find("../other/") != std::string::npos, e);
    CHECK_MESSAGE(e.find("not a plain file name") != std::string::npos, e);
  }
  {
    // As a writer before index_offset wrote it: CheckpointReader and Load download it (the
    // shards' indexes read through HDF5) and return the same bytes.
    Metadata m = md;
    for (FileMeta& file : m.files) file.index_offset = file.index_bytes = 0;
    Upload(*f.s3, f.bucket.name(), "old/step-1", f.local);
    const std::string url = put("old/step-1", m);
    const std::string e = ErrorOf([&] { CheckpointReader::Open(url, f.Options())->VerifyChunk("model.w", 0); });
    CHECK_MESSAGE(e == "(no error)", e);
    CHECK(LoadRanks(url, 3, f.Options()).w == LoadRanks(f.local.string(), 3).w);
  }
  {
    Metadata m = md;  // an index place past the object: refused before a GET
    m.files[0].index_offset = m.files[0].bytes;
    const std::string e = ErrorOf([&] { LoadRanks(put("past/step-1", m), 1, f.Options()); });
    CHECK_MESSAGE(e.find("outside its " + std::to_string(m.files[0].bytes) + " bytes") != std::string::npos, e);
  }
  {
    Metadata m = md;  // an absurd size: the object's real size differs, refused before a byte is fetched
    m.files[0].bytes = uint64_t{1} << 60;
    Upload(*f.s3, f.bucket.name(), "huge/step-1", f.local);
    const std::string e = ErrorOf([&] { LoadRanks(put("huge/step-1", m), 1, f.Options()); });
    CHECK_MESSAGE(e.find("metadata.json says 1152921504606846976") != std::string::npos, e);
  }
}

TEST_CASE("VerifyCheckpoint of s3:// reaches the store through CheckOptions::s3, not only the AWS environment") {
  Fixture f;
  for (const char* name : {"AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY",
                           "AWS_SESSION_TOKEN", "AWS_PROFILE"}) {
    ::unsetenv(name);
  }
  ::setenv("AWS_SHARED_CREDENTIALS_FILE", (f.tmp / "no-credentials").c_str(), 1);
  ::setenv("AWS_CONFIG_FILE", (f.tmp / "no-config").c_str(), 1);
  CheckOptions o;
  o.s3 = f.Options();
  const VerifyReport ranged = VerifyCheckpoint(f.url, o);
  CHECK(ranged.ok());
  CHECK(ranged.mode == "ranged");
  CHECK(ranged.bytes_read > 0);
  o.check_finite = true;  // the downloaded mode, its cache under the options' staging_dir
  o.s3.staging_dir = f.tmp / "verify-cache";
  const VerifyReport downloaded = VerifyCheckpoint(f.url, o);
  CHECK(downloaded.ok());
  CHECK(downloaded.mode == "downloaded");
  CHECK(fs::is_empty(o.s3.staging_dir));
  o.s3.cache_max_bytes = 1000;
  CHECK(ErrorOf([&] { VerifyCheckpoint(f.url, o); }).find("allowed here") != std::string::npos);
}

TEST_CASE("a server answering another range than asked is refused (through the fault proxy)") {
  Fixture f;
  s3_test::FaultProxy proxy(s3_test::PortOf(f.s3->config().endpoint), {}, s3_test::FaultProxy::Action::kShiftRange);
  ObjectStoreOptions o = f.Options(proxy.endpoint());
  const std::string e = ErrorOf([&] { LoadRanks(f.url, 1, o); });
  CHECK_MESSAGE(e.find("the server answered the range") != std::string::npos, e);
  CHECK_MESSAGE(e.find("run/step-1/shard-") != std::string::npos, e);
}

TEST_CASE("a compressed checkpoint on s3:// loads and reads by download (ranged GETs do not read compressed chunks yet)") {
  Fixture f;
  SaveOptions zstd;
  zstd.compression.codec = Compression::Codec::kZstd;
  const fs::path local = f.tmp / "zstd";
  SaveLocal(local, zstd);
  Upload(*f.s3, f.bucket.name(), "zstd/step-1", local);
  const std::string url = "s3://" + f.bucket.name() + "/zstd/step-1";
  const Loaded remote = LoadRanks(url, 3, f.Options());
  CHECK(remote.w == LoadRanks(local.string(), 3).w);
  CHECK(remote.w.back().back() == Value(kRows - 1, kCols - 1));
  CHECK(remote.blob == ckpt_test::RandomBytes(5000, 7));
  // CheckpointReader downloads it too, into a cache that goes with the last reader of it.
  std::vector<float> row(kCols);
  {
    ObjectStoreOptions o = f.Options();
    o.staging_dir = f.tmp / "reader-cache";
    auto reader = CheckpointReader::Open(url, o);
    auto again = reader->Reopen();
    reader.reset();
    again->ReadRegion("model.w", Box{{kRows - 1, 0}, {1, kCols}}, row.data(), true);
    CHECK(row.back() == Value(kRows - 1, kCols - 1));
    std::size_t caches = 0;
    for (const auto& e : fs::directory_iterator(o.staging_dir)) caches += e.path().filename().string().rfind("load-", 0) == 0;
    CHECK(caches == 1);
    again.reset();
    caches = 0;
    for (const auto& e : fs::directory_iterator(o.staging_dir)) caches += e.path().filename().string().rfind("load-", 0) == 0;
    CHECK(caches == 0);
    // Above the cache's bound: refused before a byte is fetched.
    o.cache_max_bytes = 1000;
    CHECK(ErrorOf([&] { CheckpointReader::Open(url, o); }).find("allowed here") != std::string::npos);
  }
}

TEST_CASE("Load from s3:// of many small (packed) tensors: a run of them comes by one GET, only their bytes") {
  Fixture f;  // (its checkpoint is not used here)
  constexpr int kTensors = 300;
  constexpr std::size_t kN = 64;  // 256 B each: packed
  const fs::path dir = f.tmp / "small";
  std::vector<std::vector<float>> saved(kTensors, std::vector<float>(kN));
  {
    StateDict sd;
    for (int t = 0; t < kTensors; ++t) {
      for (std::size_t i = 0; i < kN; ++i) saved[t][i] = static_cast<float>(t * 1000 + static_cast<int>(i));
      sd.Add("p." + std::to_string(t), Tensor::Full(DType::kFloat32, {static_cast<int64_t>(kN)}, saved[t].data()));
    }
    SingleComm comm;
    Save(dir, sd, comm);
  }
  Upload(*f.s3, f.bucket.name(), "small", dir);
  auto counting = std::make_shared<CountingStore>(f.s3);
  UseStore use(counting);
  std::vector<std::vector<float>> loaded(kTensors, std::vector<float>(kN, -1.0f));
  StateDict sd;
  for (int t = 0; t < kTensors; ++t) {
    sd.Add("p." + std::to_string(t), Tensor::Full(DType::kFloat32, {static_cast<int64_t>(kN)}, loaded[t].data()));
  }
  SingleComm comm;
  Load("s3://" + f.bucket.name() + "/small", sd, comm);
  CHECK(loaded == saved);
  const uint64_t returned = kTensors * kN * sizeof(float);
  MESSAGE(kTensors, " tensors of ", kN * sizeof(float), " B: ", counting->gets.load(), " GETs, ",
          counting->bytes.load(), " bytes fetched for ", returned, " returned");
  // metadata.json, the index, and the packed bytes in a few windows (each of the
  // LoadOptions::io_threads readers starts one): not one GET per tensor, and no more bytes
  // than those windows hold.
  const Metadata md = ReadMetadata(dir, /*resolve=*/false);
  REQUIRE(md.files.size() == 1);
  const uint64_t overhead = fs::file_size(dir / "metadata.json") + md.files[0].index_bytes;
  const auto readers = static_cast<uint64_t>(LoadOptions{}.io_threads);
  CHECK(counting->gets.load() <= 2 + 2 * readers);
  CHECK(counting->bytes.load() <= overhead + readers * returned);
}
