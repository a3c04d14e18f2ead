// tools/merge.cc: ckpt-merge and ckpt-convert, over ckpt::ops::Merge.
#include <iostream>

#include "ckpt/ops/merge.h"
#include "cli.h"

namespace ckpt::tools {
namespace {

struct MergeFlags {
  std::string src, dst, dtype, compress = "none", chunk_size = "16MiB";
  ops::MergeOptions o;
};

void AddWriteFlags(CLI::App& app, MergeFlags& f) {
  app.add_option("SRC", f.src, "Checkpoint directory, shard .h5 holding whole tensors, or .safetensors")->required();
  app.add_option("DST", f.dst, "Output: a checkpoint directory, or a file ending in .safetensors")->required();
  app.add_option("--world", f.o.world, "Write a SHARDED checkpoint of M files, as M ranks would have")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--dim", f.o.dim, "Dimension tensors are split along with --world")->capture_default_str()
      ->check(CLI::Range(0, 31));
  app.add_option("--dtype", f.dtype, "Cast floating tensors (bfloat16, float16, float32, float64)");
  app.add_option("--compress", f.compress, "none, zstd or zstd:LEVEL")->capture_default_str();
  app.add_flag("--force", f.o.force, "Replace an existing DST");
  app.add_option("--chunk-size", f.chunk_size,
                 "When tensors pass through memory (--dtype, --compress, a compressed source), those larger\n"
                 "than this are stored as several chunks (up to --max-memory / 8); others are copied file\n"
                 "to file, one chunk per tensor (or per --world part)")
      ->capture_default_str();
  app.add_option("--keys", f.o.keys, "Only keys matching this glob (repeatable)")
      ->allow_extra_args(false)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_option("--exclude", f.o.exclude, "Skip keys matching this glob (repeatable), e.g. 'optimizer.*'")
      ->allow_extra_args(false)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_flag("--skip-unsupported", f.o.skip_unsupported,
               "Skip safetensors tensors of a dtype ckpt does not support (a warning names each one)\n"
               "instead of refusing the whole file");
}

int RunWrite(CLI::App& app, Common& common, MergeFlags& f, int argc, char** argv) {
  return Run(app, common, argc, argv, [&] {
    f.o.max_memory = ParseSize(common.max_memory);
    f.o.chunk_bytes = ParseSize(f.chunk_size);
    if (!f.dtype.empty()) f.o.cast = ParseDType(f.dtype);
    f.o.compression = ParseCompression(f.compress);
    f.o.progress = !common.quiet;
    const ops::MergeReport r = ops::Merge(f.src, f.dst, f.o);
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
             "  ckpt-merge ckpt/step-1000 full.h5 --virtual          # HDF5 virtual datasets, no copy\n\n"
             "Exit codes: 0 ok, 1 the source is corrupt, 2 usage or I/O error.");
  Common common;
  AddCommon(app, common, "ckpt-merge", true);
  MergeFlags f;
  AddWriteFlags(app, f);
  app.add_flag("--virtual", f.o.virtual_file,
               "Write one HDF5 file of virtual datasets that stitch each tensor from the shards\n"
               "(named relative to it: move the two together)");
  app.add_flag("--verify-data", f.o.verify_data, "Re-read and checksum the output before committing it");
  return RunWrite(app, common, f, argc, argv);
}

int ConvertMain(int argc, char** argv) {
  CLI::App app("Convert between safetensors and ckpt: .safetensors -> checkpoint (--world N to write it\n"
               "sharded, as N ranks would have) and checkpoint -> .safetensors (merged). Bit-exact for every\n"
               "dtype both have; safetensors' __metadata__ travels as the checkpoint's user metadata.",
               "ckpt-convert");
  app.footer("Examples:\n  ckpt-convert model.safetensors ckpt/model --world 4\n"
             "  ckpt-convert ckpt/step-1000 model.safetensors --exclude 'optimizer.*'\n"
             "  ckpt-convert model.safetensors ckpt/model --skip-unsupported   # e.g. leave out F8_E8M0 tensors\n\n"
             "Exit codes: 0 ok, 1 the source is malformed, 2 usage or I/O error.");
  Common common;
  AddCommon(app, common, "ckpt-convert", true);
  MergeFlags f;
  AddWriteFlags(app, f);
  return RunWrite(app, common, f, argc, argv);
}

}  // namespace ckpt::tools
