// tools/inspect.cc: ckpt-inspect, over ckpt::ops::Inspect.
#include <iostream>

#include "ckpt/ops/inspect.h"
#include "cli.h"

namespace ckpt::tools {

int InspectMain(int argc, char** argv) {
  CLI::App app("Summarise a checkpoint directory, a single shard (.h5) or a .safetensors file:\n"
               "format, files, the recorded save timings, and one line per key (dtype, shape, chunks,\n"
               "bytes, layout).",
               "ckpt-inspect");
  app.footer("Examples:\n  ckpt-inspect ckpt/step-1000\n  ckpt-inspect ckpt/step-1000 --tree --key 'model.*'\n"
             "  ckpt-inspect model.safetensors --stats --json\n  ckpt-inspect s3://bucket/run/step-1000\n\n"
             "Exit codes: 0 ok, 1 a problem found (a missing or unreadable file), 2 usage or I/O error,\n"
             "3 the input checkpoint changed while it was read (replaced by another process: run again).");
  Common common;
  AddCommon(app, common, "ckpt-inspect", true);
  std::string path;
  ops::InspectOptions o;
  bool tree = false;
  app.add_option("PATH", path, "Checkpoint directory, shard .h5, .safetensors file, or the Hub's sharded safetensors\n"
                 "(model.safetensors.index.json, or the directory holding it), or s3://bucket/prefix/step (its\n"
                 "metadata.json only; the store is reached by the AWS_* environment: AWS_ENDPOINT_URL, ...)")->required();
  app.add_flag("--tree", tree, "Group keys by their dotted prefixes, with subtotals");
  app.add_option("--key", o.keys, "Only keys matching this glob (repeatable)")
      ->allow_extra_args(false)->multi_option_policy(CLI::MultiOptionPolicy::TakeAll);
  app.add_flag("--stats", o.stats, "Per tensor min, max, mean, std, NaN and Inf counts");
  return Run(app, common, argc, argv, [&] {
    o.max_memory = ParseSize(common.max_memory);
    o.progress = !common.quiet;
    const ops::InspectReport r = ops::Inspect(path, o);
    if (common.json) std::cout << ops::RenderInspectJson(r);
    else if (!common.quiet) std::cout << ops::RenderInspectText(r, tree, o.stats);
    for (const auto& p : r.problems) if (common.quiet || common.json) std::cerr << "ckpt-inspect: " << p << "\n";
    return r.problems.empty() ? kExitOk : kExitProblem;
  });
}

}  // namespace ckpt::tools
