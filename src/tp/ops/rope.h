#pragma once
// Rotary position embeddings, rotate-half convention (Transformers' Llama
// apply_rotary_pos_emb): for i < R/2, with angle a = position * inv_freq[i],
//   y[i]       = x[i] cos a - x[i + R/2] sin a
//   y[i + R/2] = x[i + R/2] cos a + x[i] sin a
// R = 2 * inv_freq.size() may be less than the head dim D (partial rotary): the
// remaining D - R values pass through.
#include <string>
#include <vector>

#include "tp/tensor/tensor.h"

namespace tp::ops {

struct RopeScaling {  // rope_type "default" or "llama3" (config.json rope_scaling)
  std::string rope_type = "default";
  double factor = 1.0, low_freq_factor = 1.0, high_freq_factor = 4.0;
  int64_t original_max_position_embeddings = 8192;
};

// inv_freq[i] = 1 / theta^(2i / rotary_dim), in f32 as Transformers computes it,
// then llama3 scaling as in Transformers' _compute_llama3_parameters.
std::vector<float> rope_inv_freq(int64_t rotary_dim, double theta, const RopeScaling& scaling = {});

// x [B, T, H, D] f32; positions [B, T] i64 (or i32). Differentiable w.r.t. x.
Tensor apply_rope(const Tensor& x, const Tensor& positions, const std::vector<float>& inv_freq);

}  // namespace tp::ops
