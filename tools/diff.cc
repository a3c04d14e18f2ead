// tools/diff.cc: ckpt-diff, over ckpt::ops::Diff.
#include <iostream>

#include "ckpt/ops/diff.h"
#include "cli.h"

namespace ckpt::tools {

int DiffMain(int argc, char** argv) {
  CLI::App app("Compare the logical tensors of two checkpoints, shards or safetensors files, whatever\n"
               "their sharding: keys only in one side, likely renames, dtype/shape changes, value differences.",
               "ckpt-diff");
  app.footer("Examples:\n  ckpt-diff ckpt/step-1000 merged.safetensors\n"
             "  ckpt-diff run1/step-500 run2/step-500 --atol 1e-6 --exclude 'optimizer.*'\n\n"
             "Exit codes: 0 same, 1 different, 2 usage or I/O error,\n"
             "3 the input checkpoint changed while it was read (replaced by another process: run again).");
  Common common;
  AddCommon(app, common, "ckpt-diff", true);
  std::string a, b;
  ops::DiffOptions o;
  app.add_option("A", a, "First checkpoint, shard or .safetensors")->required();
  app.add_option("B", b, "Second checkpoint, shard or .safetensors")->required();
  app.add_option("--atol", o.atol, "Absolute tolerance: |a-b| <= atol + rtol*|b| is equal")->check(CLI::NonNegativeNumber);
  app.add_option("--rtol", o.rtol, "Relative tolerance")->check(CLI::NonNegativeNumber);
  app.add_flag("--nan-equal", o.nan_equal,
               "Treat any NaN as equal to any NaN (without a tolerance, identical bits are always equal; "
               "with --atol/--rtol a NaN otherwise differs)");
  app.add_flag("--keys-only", o.keys_only, "Compare keys, kinds, dtypes and shapes only; read no data");
  app.add_option("--exclude", o.exclude, "Skip keys matching this glob (repeatable)")
      ->allow_extra_args(false)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  return Run(app, common, argc, argv, [&] {
    o.max_memory = ParseSize(common.max_memory);
    o.progress = !common.quiet;
    const ops::DiffReport r = ops::Diff(a, b, o);
    if (common.json) std::cout << ops::RenderDiffJson(r);
    else if (!common.quiet) std::cout << ops::RenderDiffText(r);
    return r.same() ? kExitOk : kExitProblem;
  }, kExitError);
}

}  // namespace ckpt::tools
