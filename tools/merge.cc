// tools/merge.cc: ckpt-merge and ckpt-convert, over ckpt::ops::Merge; an s3:// destination
// built in a local staging directory, verified, then published (files::CheckpointPublisher).
#include <chrono>
#include <iostream>

#include "ckpt/files.h"
#include "ckpt/ops/merge.h"
#include "cli.h"

namespace ckpt::tools {
namespace {

struct MergeFlags {
  std::string src, dst, dtype, compress = "none", chunk_size = "16MiB", max_shard_size, pack_bytes = "0";
  ops::MergeOptions o;
};

void AddWriteFlags(CLI::App& app, MergeFlags& f) {
  app.add_option("SRC", f.src,
                 "Checkpoint directory, shard .h5 holding whole tensors, .safetensors, or the Hub's sharded\n"
                 "safetensors (model.safetensors.index.json, or the directory holding it), or a checkpoint at\n"
                 "s3://bucket/prefix/step (read by ranged GETs, every block checked; the store from the AWS_*\n"
                 "environment)")->required();
  app.add_option("DST", f.dst,
                 "Output: a checkpoint directory, a file ending in .safetensors, an index ending in\n"
                 ".safetensors.index.json (the Hub's sharded layout: shards beside it), or a checkpoint at\n"
                 "s3://bucket/prefix/step: written whole and verified in a local staging directory\n"
                 "($TMPDIR/ckpt-s3-staging, removed after), then uploaded as new objects and committed by one\n"
                 "conditional PUT of metadata.json (the store from the AWS_* environment); with --force it\n"
                 "replaces only the checkpoint seen at the start (another writer's commit meanwhile: refused)")->required();
  app.add_option("--world", f.o.world, "Write a SHARDED checkpoint of M files, as M ranks would have")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--dim", f.o.dim, "Dimension tensors are split along with --world")->capture_default_str()
      ->check(CLI::Range(0, 31));
  app.add_option("--dtype", f.dtype,
                 "Cast floating tensors (bfloat16, float16, float32, float64); float8_e8m0fnu scales and\n"
                 "packed float4_e2m1fn_x2 keep their dtype");
  app.add_option("--max-shard-size", f.max_shard_size,
                 "Safetensors output in shards of at most this many tensor bytes, as save_pretrained\n"
                 "(5GB = 5e9, 500MB, 2GiB, or bytes; a larger tensor gets a shard of its own):\n"
                 "<stem>-00001-of-0000N.safetensors + <stem>.safetensors.index.json beside DST, or DST\n"
                 "alone when it ends in .safetensors and all fits in one. Default for an index DST: 5GB");
  app.add_option("--compress", f.compress, "none, zstd or zstd:LEVEL")->capture_default_str();
  app.add_flag("--force", f.o.force, "Replace an existing DST (on s3://: the one there when the run began)");
  app.add_option("--chunk-size", f.chunk_size,
                 "When tensors pass through memory (--dtype, --compress, a compressed source), those larger\n"
                 "than this are stored as several chunks (up to --max-memory / 8); others are copied file\n"
                 "to file, one chunk per tensor (or per --world part)")
      ->capture_default_str();
  app.add_option("--pack-bytes", f.pack_bytes,
                 "Pack chunks of at most this many bytes that pass through memory into shared pack datasets\n"
                 "(FORMAT.md 5.7; e.g. 64KiB, as ckpt::Save does); 0: each chunk its own dataset")
      ->capture_default_str();
  app.add_option("--keys", f.o.keys, "Only keys matching this glob (repeatable)")
      ->allow_extra_args(false)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--exclude", f.o.exclude, "Skip keys matching this glob (repeatable), e.g. 'optimizer.*'")
      ->allow_extra_args(false)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_flag("--skip-unsupported", f.o.skip_unsupported,
               "Skip safetensors tensors of a dtype ckpt does not support (a warning names each one)\n"
               "instead of refusing the whole file");
}

bool EndsWith(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// An s3:// destination: the destination checked first (absent, or --force: its metadata.json's
// ETag kept), the checkpoint written and verified in a local staging directory as a local
// destination is, then its files uploaded under names unique to this run and metadata.json
// committed by one conditional PUT (If-None-Match: *, or If-Match on that ETag).
ops::MergeReport MergeToStore(const MergeFlags& f) {
  const auto t0 = std::chrono::steady_clock::now();
  if (f.o.virtual_file)
    throw Error(ErrorCode::kInvalidArgument,
                f.dst + ": --virtual writes one local HDF5 file that names the shards; it cannot go to s3://");
  if (EndsWith(f.dst, ".safetensors") || EndsWith(f.dst, ".safetensors.index.json") || f.o.max_shard_size)
    throw Error(ErrorCode::kInvalidArgument,
                f.dst + ": an s3:// destination is a checkpoint (its files uploaded, metadata.json committed last); "
                        "write safetensors to a local path");
  ObjectStoreOptions store;  // endpoint and credentials from the AWS_* environment
  files::CheckpointPublisher publisher(f.dst, store, f.o.force);
  ops::MergeOptions o = f.o;
  o.force = false;
  const std::filesystem::path out = publisher.staging() / "checkpoint";
  ops::MergeReport r = ops::Merge(f.src, out, o);
  const std::vector<std::string> objects = publisher.Publish(out);
  r.dst = f.dst;
  r.notes.push_back("uploaded as " + std::to_string(objects.size()) +
                    " new object(s) and committed by one conditional PUT of metadata.json");
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return r;
}

int RunWrite(CLI::App& app, Common& common, MergeFlags& f, int argc, char** argv) {
  return Run(app, common, argc, argv, [&] {
    f.o.max_memory = ParseSize(common.max_memory);
    f.o.chunk_bytes = ParseSize(f.chunk_size);
    f.o.pack_bytes = f.pack_bytes == "0" ? 0 : ParseSize(f.pack_bytes);
    if (!f.dtype.empty()) f.o.cast = ParseDType(f.dtype);
    if (!f.max_shard_size.empty()) f.o.max_shard_size = ParseShardSize(f.max_shard_size);
    f.o.compression = ParseCompression(f.compress);
    f.o.progress = !common.quiet;
    const ops::MergeReport r = f.dst.rfind("s3://", 0) == 0 ? MergeToStore(f) : ops::Merge(f.src, f.dst, f.o);
    for (const std::string& s : r.skipped)
      std::cerr << app.get_name() << ": warning: skipped tensor " << s << ": a dtype ckpt does not support\n";
    if (common.json) std::cout << ops::RenderMergeJson(r);
    else if (!common.quiet) std::cout << ops::RenderMergeText(r);
    return kExitOk;
  });
}

}  // namespace

int MergeMain(int argc, char** argv) {
  CLI::App app("Merge a sharded checkpoint into one FULL file, or reshard it for another world size.\n"
               "Tensors are copied file to file inside the kernel where their bytes stay as they are, else\n"
               "streamed through memory within --max-memory; every source chunk's checksum is checked on the\n"
               "way; the output is verified, then committed atomically.",
               "ckpt-merge");
  app.footer("Examples:\n  ckpt-merge ckpt/step-1000 full/                      # FULL, one file\n"
             "  ckpt-merge ckpt/step-1000 resharded/ --world 8       # 8 files, split along dim 0\n"
             "  ckpt-merge ckpt/step-1000 model.safetensors --exclude 'optimizer.*' --dtype bfloat16\n"
             "  ckpt-merge ckpt/step-1000 hf/model.safetensors --max-shard-size 5GB   # the Hub's layout\n"
             "  ckpt-merge ckpt/step-1000 full.h5 --virtual          # HDF5 virtual datasets, no copy\n"
             "  ckpt-merge s3://bucket/run/step-1000 s3://bucket/full/step-1000   # store to store\n\n"
             "Exit codes: 0 ok, 1 the source is corrupt, 2 usage or I/O error (DST exists without --force;\n"
             "on s3://, another writer committed DST first),\n"
             "3 the input checkpoint changed while it was read (replaced by another process: run again).");
  Common common;
  AddCommon(app, common, "ckpt-merge", true);
  MergeFlags f;
  AddWriteFlags(app, f);
  app.add_flag("--virtual", f.o.virtual_file,
               "Write one HDF5 file of virtual datasets that stitch each tensor from the shards\n"
               "(named relative to it: move the two together); packed small chunks are copied into it.\n"
               "h5ls / h5py see every tensor by its key");
  app.add_flag("--verify-data", f.o.verify_data, "Re-read and checksum the output before committing it");
  return RunWrite(app, common, f, argc, argv);
}

int ConvertMain(int argc, char** argv) {
  CLI::App app("Convert between safetensors and ckpt: .safetensors, or the Hub's sharded layout (an index\n"
               "and its shards), -> checkpoint (--world N to write it sharded, as N ranks would have) and\n"
               "checkpoint -> .safetensors (merged, or in shards with --max-shard-size). Bit-exact for every\n"
               "dtype both have; safetensors' __metadata__ travels as the checkpoint's user metadata.",
               "ckpt-convert");
  app.footer("Examples:\n  ckpt-convert model.safetensors ckpt/model --world 4\n"
             "  ckpt-convert ckpt/step-1000 model.safetensors --exclude 'optimizer.*'\n"
             "  ckpt-convert hf-model/ ckpt/model                 # model.safetensors.index.json + shards\n"
             "  ckpt-convert ckpt/step-1000 out/model.safetensors.index.json --max-shard-size 2GB\n"
             "  ckpt-convert model.safetensors ckpt/model --skip-unsupported   # leave out tensors of unknown dtypes\n"
             "  ckpt-convert model.safetensors s3://bucket/models/m --world 4  # a checkpoint on the store\n\n"
             "Exit codes: 0 ok, 1 the source is malformed, 2 usage or I/O error (DST exists without --force;\n"
             "on s3://, another writer committed DST first),\n"
             "3 the input checkpoint changed while it was read (replaced by another process: run again).");
  Common common;
  AddCommon(app, common, "ckpt-convert", true);
  MergeFlags f;
  AddWriteFlags(app, f);
  return RunWrite(app, common, f, argc, argv);
}

}  // namespace ckpt::tools
