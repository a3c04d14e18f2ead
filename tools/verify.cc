// tools/verify.cc: ckpt-verify, over ckpt::ops::Verify.
#include <iostream>

#include "ckpt/files.h"
#include "ckpt/ops/verify.h"
#include "cli.h"

namespace ckpt::tools {

int VerifyMain(int argc, char** argv) {
  CLI::App app("Check a checkpoint and report every problem, each naming its file and key:\n"
               "metadata against the schema, files, tiling, datasets, checksums (all data).",
               "ckpt-verify");
  app.footer("Examples:\n  ckpt-verify ckpt/step-1000\n  ckpt-verify ckpt/step-1000 --quick --expect keys.json\n"
             "  ckpt-verify ckpt/step-1000 --check-finite --junit verify.xml\n  ckpt-verify s3://bucket/run/step-1000\n\n"
             "Exit codes: 0 ok, 1 problems found, 2 usage or I/O error,\n"
             "3 the input checkpoint changed while it was read (replaced by another process: run again).");
  Common common;
  AddCommon(app, common, "ckpt-verify", false);
  std::string path, expect, junit, schema;
  ops::VerifyOptions o;
  app.add_option("PATH", path, "Checkpoint directory (or a lone shard, a safetensors file, or the Hub's sharded safetensors:\n"
                 "an index or the directory holding it), or s3://bucket/prefix/step (checked by ranged GETs, or\n"
                 "on a downloaded copy where ranges cannot check it: compressed, format v1, --check-finite;\n"
                 "the store is reached by the AWS_* environment: AWS_ENDPOINT_URL, AWS_ACCESS_KEY_ID, ...)")->required();
  app.add_flag("--quick", o.quick, "Skip reading data: metadata, files, tiling and datasets only");
  app.add_flag("--check-finite", o.check_finite, "Fail on NaN or Inf in floating tensors");
  app.add_option("--expect", expect,
                 "Fail unless keys, dtypes and shapes equal REF's (a checkpoint, or ckpt-inspect --json output)");
  app.add_option("--junit", junit, "Also write a JUnit XML report to FILE");
  app.add_option("--schema", schema, "Validate metadata.json against this schema instead of the built-in one");
  app.add_option("--threads", o.threads, "Threads reading data, at most (never more than the cores)")->capture_default_str()->check(CLI::Range(1, 256));
  return Run(app, common, argc, argv, [&] {
    if (!expect.empty()) o.expect = expect;
    if (!schema.empty()) o.schema = schema;
    o.progress = !common.quiet;
    const ops::VerifyReport r = ops::Verify(path, o);
    if (!junit.empty()) files::CommitFile(junit, ops::RenderVerifyJUnit(r));  // staged, fsynced, renamed into place
    if (common.json) std::cout << ops::RenderVerifyJson(r);
    else if (!common.quiet || !r.ok()) std::cout << ops::RenderVerifyText(r);
    return r.ok() ? kExitOk : kExitProblem;
  }, kExitProblem);
}

}  // namespace ckpt::tools
