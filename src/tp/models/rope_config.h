#pragma once
// Yarn RoPE as config.json's rope_scaling describes it, for every architecture
// that uses it (DeepSeek-V2's rope dims, GPT-OSS's heads).
#include "tp/models/config.h"
#include "tp/ops/rope.h"

namespace tp {

// The frequencies and cos/sin factor of `rotary_dim` rotary dims (rope_type "yarn").
// As Transformers' _compute_yarn_parameters: with original_max_position_embeddings
// given, the factor is max_position_embeddings / it.
ops::YarnRope yarn_rope_for(const ModelConfig& c, int64_t rotary_dim);

}  // namespace tp
