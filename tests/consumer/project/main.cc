// A program that uses an installed libckpt: save from two ranks, load into one.
#include <ckpt/ckpt.h>

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
  std::printf("consumer: %s (ckpt %s)\n", back == v ? "ok" : "WRONG", CKPT_VERSION_STRING);
  return back == v ? 0 : 1;
}
