// ckpt-inspect and ckpt-verify of s3:// checkpoints on the real gateway, run in-process as
// their mains, the store reached through the AWS_* environment as a user's shell gives it:
// inspect reads metadata.json alone (text and --json); verify checks in "ranged" mode and
// exits 0 on a good checkpoint, 1 naming the object, key and block on a flipped byte, 2 on a
// missing checkpoint, 3 when a replace collects its objects mid-verify, a chunk larger than
// one fetch checked slice by slice; merge and convert read an s3:// source and write an
// s3:// destination (staged locally, verified, published by files::CheckpointPublisher:
// unique object names, one conditional PUT).
#include <doctest/doctest.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>

#include "checkpoint/object_save.h"
#include "cli.h"
#include "ckpt/checkpoint.h"
#include "ckpt/comm.h"
#include "ckpt/files.h"
#include "forwarding_store.h"
#include "s3_gateway.h"
#include "storage/s3_store.h"
#include "test_util.h"

using namespace ckpt;
namespace fs = std::filesystem;
namespace st = ckpt::storage;

namespace {

constexpr int64_t kRows = 256, kCols = 512;  // model.w: float32, 2 KiB a row, 512 KiB

// The gateway as the AWS environment names it (what the tools read), no ~/.aws files.
void SetAwsEnvironment(const st::s3::S3Config& c, const fs::path& tmp) {
  ::setenv("AWS_ENDPOINT_URL", c.endpoint.c_str(), 1);
  ::setenv("AWS_ACCESS_KEY_ID", c.credentials.access_key_id.c_str(), 1);
  ::setenv("AWS_SECRET_ACCESS_KEY", c.credentials.secret_access_key.c_str(), 1);
  ::setenv("AWS_REGION", c.region.c_str(), 1);
  ::unsetenv("AWS_SESSION_TOKEN");
  ::unsetenv("AWS_PROFILE");
  ::setenv("AWS_CONFIG_FILE", (tmp / "no-aws-config").c_str(), 1);
  ::setenv("AWS_SHARED_CREDENTIALS_FILE", (tmp / "no-aws-credentials").c_str(), 1);
}

std::string ReadFile(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// What a tool's main returned and printed.
struct Ran {
  int code = -1;
  std::string out, err;
};

Ran RunTool(int (*tool)(int, char**), std::vector<std::string> args) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  std::ostringstream out, err;
  auto* old_out = std::cout.rdbuf(out.rdbuf());
  auto* old_err = std::cerr.rdbuf(err.rdbuf());
  Ran r;
  r.code = tool(static_cast<int>(argv.size()), argv.data());
  std::cout.rdbuf(old_out);
  std::cerr.rdbuf(old_err);
  r.out = out.str();
  r.err = err.str();
  return r;
}

// Saves a checkpoint to `dir` from `world` ranks: model.w row-sharded (the values CheckModelW
// expects), where `with_blob` a bytes entry "blob" of rank 0, and the step (7).
void SaveModelW(const fs::path& dir, int world, bool with_blob) {
  RunThreads(world, [&](Comm& comm) {
    const int64_t rows = kRows / world, r0 = rows * comm.rank();
    std::vector<float> w(static_cast<std::size_t>(rows * kCols));
    for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(r0 * kCols + static_cast<int64_t>(i)) * 0.5f;
    StateDict sd;
    sd.Add("model.w", Tensor::Slice(DType::kFloat32, {kRows, kCols}, 0, r0, rows, w.data()));
    if (with_blob && comm.rank() == 0) sd.Add("blob", Bytes{ckpt_test::RandomBytes(3000, 5)});
    sd.Add("step", Scalar::Int(7));
    Save(dir, sd, comm);
  });
}

// A fresh bucket holding a checkpoint saved locally by 2 ranks (model.w row-sharded, a bytes
// entry, a scalar) and uploaded object by object under "run/step-1".
struct Fixture : s3_test::StoreFixture {
  fs::path local = tmp / "step-1";
  std::string url = Url("run/step-1");
  Fixture() : StoreFixture("s3tools") {
    SetAwsEnvironment(config, tmp.path());
    SaveModelW(local, 2, /*with_blob=*/true);
    for (const auto& e : fs::directory_iterator(local)) {
      const std::string body = ReadFile(e.path());
      store.Put(bucket.name(), "run/step-1/" + e.path().filename().string(), st::s3::AsBytes(body));
    }
  }
};

// model.w of an s3:// or local checkpoint, loaded whole; its values as the fixtures wrote them.
void CheckModelW(const std::string& path) {
  INFO(path);
  std::vector<float> w(static_cast<std::size_t>(kRows * kCols), -1.0f);
  StateDict sd;
  sd.Add("model.w", Tensor::Full(DType::kFloat32, {kRows, kCols}, w.data()));
  SingleComm comm;
  LoadOptions lo;
  lo.strict = false;  // model.w alone
  Load(path, sd, comm, lo);
  bool all = true;
  for (std::size_t i = 0; i < w.size() && all; ++i) all = w[i] == static_cast<float>(i) * 0.5f;
  CHECK(all);
}

}  // namespace

TEST_CASE("ckpt-inspect s3://: metadata.json alone, text and --json") {
  Fixture f;
  const Ran text = RunTool(tools::InspectMain, {"ckpt-inspect", f.url});
  INFO(text.out, text.err);
  CHECK(text.code == 0);
  CHECK(text.out.find("model.w") != std::string::npos);
  CHECK(text.out.find("blob") != std::string::npos);
  CHECK(text.out.find("(recorded)") != std::string::npos);  // the objects' sizes, from metadata.json
  CHECK(text.out.find("PROBLEM") == std::string::npos);
  const Ran js = RunTool(tools::InspectMain, {"ckpt-inspect", f.url, "--json"});
  INFO(js.out, js.err);
  REQUIRE(js.code == 0);
  const auto j = nlohmann::json::parse(js.out);
  CHECK(j["path"] == f.url);
  CHECK(j["format_version"] == 2);
  bool found = false;
  for (const auto& k : j["keys"])
    if (k["key"] == "model.w") found = k["shape"] == nlohmann::json::array({kRows, kCols});
  CHECK(found);
}

TEST_CASE("ckpt-verify s3://: a good checkpoint is OK in ranged mode, every byte read") {
  Fixture f;
  const Ran text = RunTool(tools::VerifyMain, {"ckpt-verify", f.url});
  INFO(text.out, text.err);
  CHECK(text.code == 0);
  CHECK(text.out.find("OK: " + f.url) != std::string::npos);
  CHECK(text.out.find("ranged") != std::string::npos);
  const Ran js = RunTool(tools::VerifyMain, {"ckpt-verify", f.url, "--json"});
  INFO(js.out, js.err);
  REQUIRE(js.code == 0);
  const auto j = nlohmann::json::parse(js.out);
  CHECK(j["ok"] == true);
  CHECK(j["mode"] == "ranged");
  CHECK(j["chunks"].get<int>() >= 3);
  CHECK(j["bytes_read"].get<uint64_t>() >= uint64_t{kRows * kCols * 4});
  const Ran quick = RunTool(tools::VerifyMain, {"ckpt-verify", f.url, "--quick", "-q"});
  CHECK(quick.code == 0);
}

TEST_CASE("ckpt-verify s3://: a flipped byte in an object exits 1 naming the object, key and block") {
  Fixture f;
  // A byte 70,000 into the model.w chunk of the second shard (of 128 KiB), uploaded again.
  const Metadata md = ReadMetadata(f.local, /*resolve=*/true);
  const ChunkMeta& chunk = md.Find("model.w")->chunks.at(1);
  const std::string shard = chunk.file;
  REQUIRE(chunk.offset);
  std::string body = ReadFile(f.local / shard);
  body.at(static_cast<std::size_t>(*chunk.offset + 70000)) ^= 0x20;
  f.s3->Put(f.bucket.name(), "run/step-1/" + shard, st::s3::AsBytes(body));

  const Ran r = RunTool(tools::VerifyMain, {"ckpt-verify", f.url});
  INFO(r.out, r.err);
  CHECK(r.code == 1);
  CHECK(r.out.find("FAILED: " + f.url) != std::string::npos);
  CHECK(r.out.find(shard) != std::string::npos);
  CHECK(r.out.find("model.w") != std::string::npos);
  CHECK(r.out.find("block") != std::string::npos);
  const Ran js = RunTool(tools::VerifyMain, {"ckpt-verify", f.url, "--json"});
  REQUIRE(js.code == 1);
  const auto j = nlohmann::json::parse(js.out);
  REQUIRE(j["problems"].size() == 1);
  CHECK(j["problems"][0]["check"] == "checksums");
  CHECK(j["problems"][0]["key"] == "model.w");
  CHECK(j["problems"][0]["file"] == shard);
  // --quick reads no data: the flip is not seen.
  CHECK(RunTool(tools::VerifyMain, {"ckpt-verify", f.url, "--quick", "-q"}).code == 0);
  // --check-finite needs every value: checked on a downloaded copy, the flip found there too,
  // named by the object's name (not the cache's path), the cache removed after.
  const Ran fin = RunTool(tools::VerifyMain, {"ckpt-verify", f.url, "--check-finite", "--json"});
  INFO(fin.out, fin.err);
  REQUIRE(fin.code == 1);
  const auto jf = nlohmann::json::parse(fin.out);
  CHECK(jf["mode"] == "downloaded");
  CHECK(jf["path"] == f.url);
  REQUIRE(jf["problems"].size() == 1);
  CHECK(jf["problems"][0]["check"] == "checksums");
  CHECK(jf["problems"][0]["file"] == shard);
  CHECK(fin.out.find("load-") == std::string::npos);
  const fs::path staging = fs::temp_directory_path() / "ckpt-s3-staging";
  if (fs::exists(staging)) {
    for (const auto& e : fs::directory_iterator(staging)) {
      CHECK(e.path().filename().string().find("load-") != 0);
    }
  }
}

TEST_CASE("ckpt-verify and ckpt-inspect s3://: a missing checkpoint or object is exit 2 / 1, named") {
  Fixture f;
  const std::string missing = "s3://" + f.bucket.name() + "/run/step-9";
  const Ran v = RunTool(tools::VerifyMain, {"ckpt-verify", missing});
  CHECK(v.code == 2);
  CHECK(v.err.find("step-9") != std::string::npos);
  CHECK(v.err.find("metadata.json") != std::string::npos);
  const Ran i = RunTool(tools::InspectMain, {"ckpt-inspect", missing, "--json"});
  CHECK(i.code == 2);
  CHECK(nlohmann::json::parse(i.out)["ok"] == false);
  // A shard object gone: named, exit 1.
  const Metadata md = ReadMetadata(f.local, /*resolve=*/false);
  f.s3->DeleteBatch(f.bucket.name(), {"run/step-1/" + md.files[1].name});
  const Ran gone = RunTool(tools::VerifyMain, {"ckpt-verify", f.url});
  INFO(gone.out, gone.err);
  CHECK(gone.code == 1);
  CHECK(gone.out.find(md.files[1].name) != std::string::npos);
  CHECK(gone.out.find("missing") != std::string::npos);
}

TEST_CASE("ckpt-verify s3://: a replace that collects the objects mid-verify exits 3 (changed), not 1") {
  Fixture f;
  // A checkpoint saved to s3:// (its objects under names unique to the save). At verify's
  // first read of a shard object, another writer replaces it and the replaced version's
  // objects are collected (grace 0): what verify was reading is gone.
  const std::string url = "s3://" + f.bucket.name() + "/run/step-2";
  ObjectStoreOptions now;
  now.staging_dir = f.tmp / "staging";
  now.leftover_grace_seconds = 0;
  const auto save = [&](int64_t step) {
    SingleComm comm;
    std::vector<float> w(4096, static_cast<float>(step));
    StateDict sd;
    sd.Add("model.w", Tensor::Full(DType::kFloat32, {64, 64}, w.data()));
    sd.Add("step", Scalar::Int(step));
    SaveOptions so;
    so.overwrite = true;
    so.s3 = now;
    Save(url, sd, comm, so);
  };
  save(2);
  std::atomic<int> replaced{0};
  const auto replace = [&] {
    save(3);
    files::CleanObjectLeftovers(url, now);
  };
  class Replacing : public s3_test::ForwardingStore {
   public:
    Replacing(std::shared_ptr<st::ObjectStore> in, std::function<void(const std::string&)> hook)
        : ForwardingStore(std::move(in)), hook_(std::move(hook)) {}
    void GetRange(const std::string& b, const std::string& k, uint64_t offset, std::span<std::byte> out) override {
      hook_(k);
      ForwardingStore::GetRange(b, k, offset, out);
    }

   private:
    std::function<void(const std::string&)> hook_;
  };
  std::mutex mu;  // the readers of verify wait for the replace to be done
  internal::SetObjectStoreWrapperForTest([&](std::shared_ptr<st::ObjectStore> in) {
    return std::make_shared<Replacing>(std::move(in), [&](const std::string& key) {
      if (key.find("/shard-") == std::string::npos) return;
      std::lock_guard lock(mu);
      if (replaced++ == 0) replace();
    });
  });
  const Ran r = RunTool(tools::VerifyMain, {"ckpt-verify", url});
  const Ran js = RunTool(tools::VerifyMain, {"ckpt-verify", url, "--json"});  // the new one
  internal::SetObjectStoreWrapperForTest(nullptr);
  INFO(r.out, r.err);
  CHECK(replaced >= 1);
  CHECK(r.code == 3);
  CHECK(r.err.find("run/step-2") != std::string::npos);
  CHECK(r.err.find("changed") != std::string::npos);
  CHECK(js.code == 0);  // verified again: the replacement, whole
}

TEST_CASE("ckpt-merge, ckpt-convert and ckpt-diff from s3:// to a local destination") {
  Fixture f;
  const fs::path merged = f.tmp / "merged";
  const Ran m = RunTool(tools::MergeMain, {"ckpt-merge", f.url, merged.string(), "-q"});
  INFO(m.out, m.err);
  REQUIRE(m.code == 0);
  CHECK(RunTool(tools::VerifyMain, {"ckpt-verify", merged.string(), "-q"}).code == 0);
  CheckModelW(merged.string());
  // ckpt-diff reads both sides through the same sources: the store's copy equals the local one.
  const Ran d = RunTool(tools::DiffMain, {"ckpt-diff", f.url, f.local.string(), "-q"});
  INFO(d.out, d.err);
  CHECK(d.code == 0);
  const fs::path st_file = f.tmp / "model.safetensors";
  const Ran c = RunTool(tools::ConvertMain, {"ckpt-convert", f.url, st_file.string(), "-q"});
  INFO(c.out, c.err);
  CHECK(c.code == 0);
  CHECK(fs::file_size(st_file) > uint64_t{kRows * kCols * 4});

  const Ran v = RunTool(tools::MergeMain, {"ckpt-merge", f.url, (f.tmp / "v.h5").string(), "--virtual"});
  CHECK(v.code == 2);
  CHECK(v.err.find("--virtual needs the shards on a local file system") != std::string::npos);
}


TEST_CASE("ckpt-merge and ckpt-convert write s3://: local->S3, S3->local, S3->S3; verified, loaded, refused when there") {
  Fixture f;
  const std::string secret = f.s3->config().credentials.secret_access_key;
  REQUIRE(!secret.empty());
  ::setenv("TMPDIR", f.tmp.path().c_str(), 1);  // the tools' staging, checked empty after
  std::vector<Ran> all;
  auto run = [&](int (*tool)(int, char**), std::vector<std::string> args) {
    all.push_back(RunTool(tool, std::move(args)));
    return all.back();
  };
  // A 4-rank checkpoint, saved locally.
  const fs::path four = f.tmp / "four";
  SaveModelW(four, 4, /*with_blob=*/false);
  const std::string b = f.bucket.name();

  // local -> S3: merged 4 -> 1, then verified and loaded from the store.
  const std::string merged = "s3://" + b + "/out/merged";
  const Ran m = run(tools::MergeMain, {"ckpt-merge", four.string(), merged});
  INFO(m.out, m.err);
  REQUIRE(m.code == 0);
  CHECK(m.out.find("wrote " + merged) != std::string::npos);
  CHECK(m.out.find("conditional PUT") != std::string::npos);
  const Ran ver = run(tools::VerifyMain, {"ckpt-verify", merged});
  INFO(ver.out, ver.err);
  CHECK(ver.code == 0);
  CheckModelW(merged);
  const Ran ins = run(tools::InspectMain, {"ckpt-inspect", merged, "--json"});
  REQUIRE(ins.code == 0);
  CHECK(nlohmann::json::parse(ins.out)["state_dict_type"] == "FULL");
  // One shard object, named uniquely to that run, and metadata.json.
  std::vector<std::string> keys = f.Keys("out/merged/");
  REQUIRE(keys.size() == 2);
  CHECK(keys[0] == "out/merged/metadata.json");
  CHECK(keys[1].rfind("out/merged/shard-00000-of-00001.", 0) == 0);
  CHECK(keys[1].size() == std::string("out/merged/shard-00000-of-00001.0123456789abcdef.h5").size());
  const std::string etag = f.s3->Head(b, "out/merged/metadata.json")->etag;

  // Already there: refused without --force, exit 2, the checkpoint untouched.
  for (auto* tool : {tools::MergeMain, tools::ConvertMain}) {
    const Ran again = run(tool, {"ckpt-x", four.string(), merged});
    INFO(again.err);
    CHECK(again.code == 2);
    CHECK(again.err.find("already") != std::string::npos);
    CHECK(again.err.find(merged) != std::string::npos);
  }
  CHECK(f.s3->Head(b, "out/merged/metadata.json")->etag == etag);
  CHECK(f.Keys("out/merged/") == keys);

  // --force replaces it (If-Match on the ETag seen at the start): a new commit naming a new object.
  const Ran forced = run(tools::MergeMain, {"ckpt-merge", f.url, merged, "--force", "--json"});
  INFO(forced.out, forced.err);
  REQUIRE(forced.code == 0);
  CHECK(nlohmann::json::parse(forced.out)["dst"] == merged);
  CHECK(f.s3->Head(b, "out/merged/metadata.json")->etag != etag);
  CheckModelW(merged);
  const Metadata replaced = ReadMetadata(merged, /*resolve=*/false);
  REQUIRE(replaced.files.size() == 1);
  CHECK("out/merged/" + replaced.files[0].name != keys[1]);  // the old one is a leftover now

  // S3 -> local, resharded to 3.
  const fs::path back = f.tmp / "back";
  const Ran down = run(tools::MergeMain, {"ckpt-merge", merged, back.string(), "--world", "3"});
  INFO(down.out, down.err);
  REQUIRE(down.code == 0);
  CHECK(run(tools::VerifyMain, {"ckpt-verify", back.string(), "-q"}).code == 0);
  CheckModelW(back.string());

  // S3 -> S3, resharded to 3.
  const std::string re = "s3://" + b + "/out/re3";
  const Ran s2s = run(tools::MergeMain, {"ckpt-merge", f.url, re, "--world", "3", "-q"});
  INFO(s2s.out, s2s.err);
  REQUIRE(s2s.code == 0);
  CHECK(ReadMetadata(re, /*resolve=*/false).files.size() == 3);
  CHECK(run(tools::VerifyMain, {"ckpt-verify", re, "-q"}).code == 0);
  CheckModelW(re);
  CHECK(run(tools::DiffMain, {"ckpt-diff", re, f.local.string(), "-q"}).code == 0);
  // Compressed (loaded by the bounded download: ranges do not read compressed chunks yet).
  const std::string z = "s3://" + b + "/out/zstd";
  REQUIRE(run(tools::MergeMain, {"ckpt-merge", merged, z, "--world", "2", "--compress", "zstd", "-q"}).code == 0);
  CHECK(ReadMetadata(z, /*resolve=*/false).Find("model.w")->compression.codec == Compression::Codec::kZstd);
  CheckModelW(z);
  // ckpt-verify checks it whole on a downloaded copy (ranges do not read compressed chunks).
  const Ran vz = run(tools::VerifyMain, {"ckpt-verify", z, "--json"});
  INFO(vz.out, vz.err);
  CHECK(vz.code == 0);
  CHECK(nlohmann::json::parse(vz.out)["mode"] == "downloaded");
  // ckpt-diff and ckpt-merge read its data through a CheckpointReader, which downloads it.
  const Ran dz = run(tools::DiffMain, {"ckpt-diff", z, merged, "-q"});
  INFO(dz.out, dz.err);
  CHECK(dz.code == 0);
  const fs::path unzipped = f.tmp / "from-zstd";
  CHECK(run(tools::MergeMain, {"ckpt-merge", z, unzipped.string(), "-q"}).code == 0);
  CheckModelW(unzipped.string());

  // safetensors -> a checkpoint on the store, 4 files, and back.
  const fs::path st_file = f.tmp / "model.safetensors";
  REQUIRE(run(tools::ConvertMain, {"ckpt-convert", four.string(), st_file.string(), "-q"}).code == 0);
  const std::string conv = "s3://" + b + "/out/conv";
  const Ran c = run(tools::ConvertMain, {"ckpt-convert", st_file.string(), conv, "--world", "4"});
  INFO(c.out, c.err);
  REQUIRE(c.code == 0);
  CHECK(ReadMetadata(conv, /*resolve=*/false).files.size() == 4);
  CHECK(run(tools::VerifyMain, {"ckpt-verify", conv, "-q"}).code == 0);
  CheckModelW(conv);
  CHECK(run(tools::DiffMain, {"ckpt-diff", conv, st_file.string(), "-q"}).code == 0);
  const fs::path conv_back = f.tmp / "conv.safetensors";
  REQUIRE(run(tools::ConvertMain, {"ckpt-convert", conv, conv_back.string(), "-q"}).code == 0);
  CHECK(ReadFile(conv_back) == ReadFile(st_file));

  // What an s3:// destination cannot be: safetensors, a virtual file. Exit 2, nothing written.
  for (const std::string& dst : {"s3://" + b + "/out/m.safetensors", "s3://" + b + "/out/m.safetensors.index.json"}) {
    const Ran r = run(tools::ConvertMain, {"ckpt-convert", four.string(), dst});
    CHECK(r.code == 2);
    CHECK(r.err.find("write safetensors to a local path") != std::string::npos);
  }
  const Ran virt = run(tools::MergeMain, {"ckpt-merge", four.string(), "s3://" + b + "/out/v", "--virtual"});
  CHECK(virt.code == 2);
  CHECK(virt.err.find("--virtual") != std::string::npos);
  CHECK(f.Keys("out/v").empty());
  CHECK(f.Keys("out/m.").empty());

  // No run left its staging behind, and none printed the secret.
  const fs::path staging = f.tmp / "ckpt-s3-staging";
  CHECK((!fs::exists(staging) || fs::is_empty(staging)));
  for (const Ran& r : all) {
    CHECK(r.out.find(secret) == std::string::npos);
    CHECK(r.err.find(secret) == std::string::npos);
  }
  ::unsetenv("TMPDIR");
}

TEST_CASE("files::CheckpointPublisher: of two publishers of one new path one commits; a replacement of a replaced checkpoint is refused") {
  Fixture f;
  const ObjectStoreOptions o = s3_test::GatewayOptions(f.s3->config());
  const std::string b = f.bucket.name();
  const std::string url = "s3://" + b + "/pub/ck";
  // Both begin before either commits: both saw no checkpoint there.
  files::CheckpointPublisher first(url, o, false), second(url, o, false);
  CHECK(first.Publish(f.local).size() == 2);
  try {
    second.Publish(f.local);
    FAIL("the second publish committed too");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::kAlreadyExists);
    CHECK(std::string(e.what()).find("another writer committed first") != std::string::npos);
  }
  // Nothing of the loser stays: the first's two objects and metadata.json.
  CHECK(f.Keys("pub/ck/").size() == 3);
  CheckModelW(url);
  // Without overwrite the destination is refused at the start, before any work.
  CHECK_THROWS_WITH_AS(files::CheckpointPublisher(url, o, false), doctest::Contains("already"), Error);
  // Two replacements that saw the same commit: the first swaps it, the second is refused.
  files::CheckpointPublisher r1(url, o, true), r2(url, o, true);
  const fs::path staged = r1.staging();
  CHECK(fs::is_directory(staged));
  r1.Publish(f.local);
  CHECK_THROWS_WITH_AS(r2.Publish(f.local), doctest::Contains("another writer committed first"), Error);
  CheckModelW(url);
  // A local file that is not as metadata.json records it is refused before any upload.
  const fs::path bad = f.tmp / "bad";
  fs::copy(f.local, bad);
  const Metadata md = ReadMetadata(bad, /*resolve=*/false);
  fs::resize_file(bad / md.files[0].name, md.files[0].bytes - 1);
  files::CheckpointPublisher r3(url, o, true);
  CHECK_THROWS_WITH_AS(r3.Publish(bad), doctest::Contains(md.files[0].name.c_str()), Error);
  CHECK(f.Keys("pub/ck/").size() == 3 + 2);  // r1's new ones + the replaced two (leftovers)

  // A checkpoint downloaded from the store and published again: its objects get the new
  // publish's nonce in place of the old one (one nonce a name, as the schema wants).
  const fs::path down = f.tmp / "down";
  files::DownloadObjectCheckpoint(url, o, down, uint64_t{1} << 30);
  const std::string again = "s3://" + b + "/pub/again";
  files::CheckpointPublisher p2(again, o, false);
  const std::vector<std::string> names = p2.Publish(down);
  const Metadata was = ReadMetadata(down, /*resolve=*/false);
  REQUIRE(names.size() == was.files.size());
  for (std::size_t i = 0; i < names.size(); ++i) {
    CHECK(names[i].size() == was.files[i].name.size());
    CHECK(names[i].substr(0, 21) == was.files[i].name.substr(0, 21));  // "shard-00000-of-00002."
    CHECK(names[i] != was.files[i].name);
  }
  SetAwsEnvironment(f.s3->config(), f.tmp.path());
  const Ran v = RunTool(tools::VerifyMain, {"ckpt-verify", again});
  INFO(v.out, v.err);
  CHECK(v.code == 0);
}

TEST_CASE("ckpt-verify s3://: a chunk larger than one fetch (40 MiB) is checked slice by slice, a flip in its tail found") {
  s3_test::StoreFixture f("s3tools-big");
  SetAwsEnvironment(f.config, f.tmp.path());
  constexpr int64_t kBigRows = 10240, kBigCols = 1024;  // float32: 40 MiB, one chunk
  std::vector<float> w(static_cast<std::size_t>(kBigRows * kBigCols));
  for (std::size_t i = 0; i < w.size(); ++i) w[i] = static_cast<float>(i % 100003);
  StateDict sd;
  sd.Add("big", Tensor::Full(DType::kFloat32, {kBigRows, kBigCols}, w.data()));
  SingleComm comm;
  Save(f.tmp / "ckpt", sd, comm);
  const Metadata md = ReadMetadata(f.tmp / "ckpt", /*resolve=*/true);
  REQUIRE(md.Find("big")->chunks.size() == 1);  // one chunk of 40 MiB: more than one fetch (32 MiB)
  const ChunkMeta& chunk = md.Find("big")->chunks.at(0);
  REQUIRE(chunk.offset);
  const std::string url = f.Url("big");
  auto upload = [&](const std::function<void(std::string&)>& edit) {
    for (const auto& e : fs::directory_iterator(f.tmp / "ckpt")) {
      std::string body = ReadFile(e.path());
      if (e.path().filename().string() == chunk.file) edit(body);
      f.store.Put(f.bucket.name(), "big/" + e.path().filename().string(), st::s3::AsBytes(body));
    }
  };
  upload([](std::string&) {});
  const Ran good = RunTool(tools::VerifyMain, {"ckpt-verify", url, "--json"});
  INFO(good.out, good.err);
  REQUIRE(good.code == 0);
  CHECK(nlohmann::json::parse(good.out)["bytes_read"].get<uint64_t>() >= uint64_t{kBigRows * kBigCols * 4});
  upload([&](std::string& body) { body.at(static_cast<std::size_t>(*chunk.offset + (uint64_t{38} << 20))) ^= 1; });
  const Ran bad = RunTool(tools::VerifyMain, {"ckpt-verify", url});
  INFO(bad.out, bad.err);
  CHECK(bad.code == 1);
  CHECK(bad.out.find("'big'") != std::string::npos);
  CHECK(bad.out.find("block") != std::string::npos);
}
