// A program that uses an installed libckpt: save from two ranks, load into one, then check
// the checkpoint with ckpt::ops::Verify (what ckpt-verify runs; libckpt_tools, ckpt::tools).
#include <ckpt/ckpt.h>
#include <ckpt/ops/verify.h>

#include <cstdio>
#include <vector>

int main(int argc, char** argv) {
  if (argc < 2) return 2;
  std::vector<double> v{1, 2, 3, 4};
  ckpt::RunThreads(2, [&](ckpt::Comm& comm) {
    ckpt::StateDict sd;
    sd.Add("x", ckpt::Tensor::Slice(ckpt::DType::kFloat64, {4}, 0, comm.rank() * 2, 2, v.data() + comm.rank() * 2));
    ckpt::Save(argv[1], sd, comm);
  });
  std::vector<double> back(4);
  ckpt::StateDict target;
  target.Add("x", ckpt::Tensor::Full(ckpt::DType::kFloat64, {4}, back.data()));
  ckpt::SingleComm one;
  ckpt::Load(argv[1], target, one);
  const ckpt::ops::VerifyReport report = ckpt::ops::Verify(argv[1], {});
  // A ckpt::Error thrown inside libckpt is caught here by type.
  bool caught = false;
  try {
    ckpt::ReadMetadata(std::string(argv[1]) + "/no-such-checkpoint");
  } catch (const ckpt::Error& e) {
    caught = e.code() == ckpt::ErrorCode::kNotFound;
  }
  const bool ok = back == v && report.ok() && caught;
  std::printf("consumer: %s (ckpt %s)\n", ok ? "ok" : "WRONG", CKPT_VERSION_STRING);
  return ok ? 0 : 1;
}
