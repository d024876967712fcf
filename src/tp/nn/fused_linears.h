#pragma once
// Linears that read the same input (attention's q|k|v, the MLP's gate|up) run at
// inference as one GEMM over their weights stacked along the output dim. Why: one
// oneDNN call and one pass over the input instead of three (two), which is most of
// a decode step's fixed cost per projection, and prefill's GEMMs get a wider N
// (k_proj and v_proj alone are N = 1024, or 512 per rank at tp = 2). Every output
// column is the same dot product over K as in its own GEMM, so the values are bit
// for bit those of the separate calls (tests/nn/test_fused_linears.cpp checks it).
#include <vector>

#include "tp/nn/layers.h"

namespace tp::nn {

class FusedLinears {
 public:
  // Called by the parent (from its finalize_weights) after the parts' weights are
  // loaded and before the parts' own finalize_weights. Fuses when every part has
  // a plain 2-D weight of one dtype (f32 or bf16) and in_features, owned by it
  // alone, and no bias; the caller vouches that the parts' styles leave their
  // forward local (plain colwise: the output is this rank's slice). Otherwise
  // nothing changes and the parts run on their own.
  void fuse(const std::vector<Linear*>& parts);
  // Fused, and no part has dropped out since (Linear::release_packed_weights).
  bool active() const;
  // Each part's output for x [..., K], as its own forward would give it without
  // gradients (its adapter included). The outputs may be views of one buffer.
  std::vector<Tensor> forward(const Tensor& x);
  // The parts' weights as they are fed to forward's GEMM (bf16 ones take a bf16 x as is).
  bool takes_bf16_input() const;
  void release();

 private:
  std::vector<Linear*> parts_;
  ops::PackedLinear packed_;
};

}  // namespace tp::nn
