// bench/common/gpt2s.h: the gpt2s workload's tensor names and shapes, as
// shared/bench/workloads.py spells them (GPT-2 small, HF naming, Conv1D in x out shapes).
// Header-only; shared by the benchmarks so they all measure the same workload.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include <ckpt/tensor.h>

namespace ckpt_bench {

// The 148 parameters of GPT-2 small (124,439,808 float32 values), in model order. The Adam
// state of each (step: int64 0-D; exp_avg, exp_avg_sq: float32, same shape) follows them.
inline std::vector<std::pair<std::string, ckpt::Shape>> Gpt2sParams() {
  const int64_t d = 768, vocab = 50257, ctx = 1024;
  std::vector<std::pair<std::string, ckpt::Shape>> p = {{"transformer.wte.weight", {vocab, d}},
                                                        {"transformer.wpe.weight", {ctx, d}}};
  for (int i = 0; i < 12; ++i) {
    const std::string h = "transformer.h." + std::to_string(i) + ".";
    p.insert(p.end(), {{h + "ln_1.weight", {d}}, {h + "ln_1.bias", {d}},
                       {h + "attn.c_attn.weight", {d, 3 * d}}, {h + "attn.c_attn.bias", {3 * d}},
                       {h + "attn.c_proj.weight", {d, d}}, {h + "attn.c_proj.bias", {d}},
                       {h + "ln_2.weight", {d}}, {h + "ln_2.bias", {d}},
                       {h + "mlp.c_fc.weight", {d, 4 * d}}, {h + "mlp.c_fc.bias", {4 * d}},
                       {h + "mlp.c_proj.weight", {4 * d, d}}, {h + "mlp.c_proj.bias", {d}}});
  }
  p.push_back({"transformer.ln_f.weight", {d}});
  p.push_back({"transformer.ln_f.bias", {d}});
  return p;
}

}  // namespace ckpt_bench
