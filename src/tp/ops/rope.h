#pragma once
// Rotary position embeddings, rotate-half convention (Transformers' Llama
// apply_rotary_pos_emb): for i < R/2, with angle a = position * inv_freq[i],
//   y[i]       = x[i] cos a - x[i + R/2] sin a
//   y[i + R/2] = x[i + R/2] cos a + x[i] sin a
// R = 2 * inv_freq.size() may be less than the head dim D (partial rotary): the
// remaining D - R values pass through.
//
// Interleaved convention (DeepSeek-V2: pairs taken as complex numbers and
// multiplied by e^{ia}; the output stays interleaved):
//   y[2i]     = x[2i] cos a - x[2i + 1] sin a
//   y[2i + 1] = x[2i + 1] cos a + x[2i] sin a
// Either convention may scale cos and sin by an attention factor (yarn's mscale).
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

// Yarn (Transformers' _compute_yarn_parameters): frequencies blended between
// interpolated (inv_freq / factor) and extrapolated ones over the correction range
// of beta_fast..beta_slow rotations, and the factor cos and sin are scaled by.
struct YarnScaling {
  double factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  double beta_fast = 32, beta_slow = 1;
  bool truncate = true;
  double attention_factor = 0;  // 0: from mscale / mscale_all_dim (or 0.1 ln(factor) + 1)
  double mscale = 0, mscale_all_dim = 0;
};
struct YarnRope {
  std::vector<float> inv_freq;
  double attention_factor = 1.0;
};
YarnRope rope_yarn(int64_t rotary_dim, double theta, const YarnScaling& yarn);
// 0.1 * mscale * ln(factor) + 1 for factor > 1, else 1 (yarn_get_mscale).
double yarn_mscale(double factor, double mscale = 1.0);

enum class RopeLayout { RotateHalf, Interleaved };
struct RopeOptions {
  RopeLayout layout = RopeLayout::RotateHalf;
  float attention_factor = 1.f;
};

// x [B, T, H, D] f32; positions [B, T] i64 (or i32). Differentiable w.r.t. x.
Tensor apply_rope(const Tensor& x, const Tensor& positions, const std::vector<float>& inv_freq,
                  const RopeOptions& options = {});

}  // namespace tp::ops
