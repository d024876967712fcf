#pragma once
// Yarn and LongRoPE as config.json's rope_scaling describes them, for every
// architecture that uses them (DeepSeek-V2's rope dims, GPT-OSS's heads, Phi-3).
#include "tp/models/config.h"
#include "tp/ops/rope.h"

namespace tp {

// The frequencies and cos/sin factor of `rotary_dim` rotary dims (rope_type "yarn").
// As Transformers' _compute_yarn_parameters: with original_max_position_embeddings
// given, the factor is max_position_embeddings / it.
ops::YarnRope yarn_rope_for(const ModelConfig& c, int64_t rotary_dim);

// LongRoPE (rope_type "longrope", Transformers' _compute_longrope_parameters):
// inv_freq[i] = 1 / (factor[i] * theta^(2i / rotary_dim)), with short_factor for a
// forward whose positions stay within original_max_position_embeddings and
// long_factor for one that reaches past it (Transformers' dynamic update: the
// largest position + 1 of the call > original_max_position_embeddings). cos and
// sin are scaled by attention_factor (given, or sqrt(1 + ln(s) / ln(original))
// for s = max_position_embeddings / original > 1, else 1).
struct LongRope {
  std::vector<float> short_inv_freq, long_inv_freq;
  double attention_factor = 1.0;
  int64_t original_max_position_embeddings = 0;
  const std::vector<float>& inv_freq_for(int64_t seq_len) const {
    return seq_len > original_max_position_embeddings ? long_inv_freq : short_inv_freq;
  }
};
// original_max_position_embeddings: rope_scaling's, else config.json's top-level
// key (Phi-3's place for it), else `absent_original` (the architecture's config
// default; 0: max_position_embeddings). Errors name the file and key when a
// factor list's length is not rotary_dim / 2.
LongRope longrope_for(const ModelConfig& c, int64_t rotary_dim, int64_t absent_original = 0);

}  // namespace tp
