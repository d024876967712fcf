#pragma once
// The keys of a DeepSeek-V2/V3 config.json beyond ModelConfig's: multi-head
// latent attention (MLA) sizes, where the mixture-of-experts layers start, and
// the MoE block's router (V2: softmax, greedy or group-limited greedy; V3:
// sigmoid, noaux_tc with e_score_correction_bias) and shared experts.
#include <cstdint>

#include "tp/models/config.h"

namespace tp {

struct DeepseekSizes {
  int64_t q_lora_rank = 0;  // 0 (null in config.json): q_proj; else q_a_proj -> q_a_layernorm -> q_b_proj
  int64_t kv_lora_rank = 0;
  int64_t qk_nope_head_dim = 0;
  int64_t qk_rope_head_dim = 0;
  int64_t v_head_dim = 0;
  int64_t first_k_dense_replace = 0;
  int64_t n_routed_experts = 0;  // 0 (or null): no MoE layers
  bool v3 = false;               // model_type deepseek_v3
  // V3's rope_interleave (default true): Transformers de-interleaves q_pe and k_pe
  // before rotating (the dot products are V2's); false: rotate-half RoPE.
  bool rope_interleave = true;
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Layer i is a mixture-of-experts layer (Transformers ignores moe_layer_freq).
  bool is_moe_layer(int64_t i) const { return n_routed_experts > 0 && i >= first_k_dense_replace; }
};

// Parsed and validated; errors name the config and the key.
DeepseekSizes deepseek_sizes(const ModelConfig& config);

struct MoeConfig;
// The MoE block of layers >= first_k_dense_replace: n_routed_experts of
// moe_intermediate_size, num_experts_per_tok, shared experts of
// moe_intermediate_size x n_shared_experts, the router's scoring (topk_method,
// n_group, topk_group, routed_scaling_factor; norm_topk_prob for V3 only, as
// Transformers ignores it for V2). Errors name the key and what is accepted.
MoeConfig deepseek_moe_config(const ModelConfig& config, const DeepseekSizes& sizes);

}  // namespace tp
