#pragma once
// The keys of a DeepSeek-V2/V3 config.json beyond ModelConfig's: multi-head
// latent attention (MLA) sizes and where the mixture-of-experts layers start.
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
  int64_t qk_head_dim() const { return qk_nope_head_dim + qk_rope_head_dim; }
  // Layer i is a mixture-of-experts layer (Transformers ignores moe_layer_freq).
  bool is_moe_layer(int64_t i) const { return n_routed_experts > 0 && i >= first_k_dense_replace; }
};

// Parsed and validated; errors name the config and the key. Until the MoE block
// is wired in (branch moe), a config with MoE layers is an error naming
// first_k_dense_replace and n_routed_experts.
DeepseekSizes deepseek_sizes(const ModelConfig& config);

}  // namespace tp
