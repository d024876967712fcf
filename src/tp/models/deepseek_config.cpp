#include "tp/models/deepseek_config.h"

#include "tp/tensor/error.h"

namespace tp {

namespace {

// An integer key: required when `fallback` is negative; null means 0 where `nullable`.
int64_t int_key(const ModelConfig& c, const char* key, int64_t fallback, bool nullable = false) {
  auto it = c.raw.find(key);
  if (it == c.raw.end() || (it->is_null() && nullable)) {
    TP_CHECK(fallback >= 0, "{}: required key '{}' is missing (a positive integer; model_type {})", c.source, key,
             c.model_type);
    return fallback;
  }
  TP_CHECK(it->is_number_integer() && it->get<int64_t>() >= 0, "{}: '{}' must be a non-negative integer{}, got {}",
           c.source, key, nullable ? " or null" : "", it->dump());
  return it->get<int64_t>();
}

}  // namespace

DeepseekSizes deepseek_sizes(const ModelConfig& c) {
  DeepseekSizes s;
  s.q_lora_rank = int_key(c, "q_lora_rank", 0, true);
  s.kv_lora_rank = int_key(c, "kv_lora_rank", -1);
  s.qk_nope_head_dim = int_key(c, "qk_nope_head_dim", -1);
  s.qk_rope_head_dim = int_key(c, "qk_rope_head_dim", -1);
  s.v_head_dim = int_key(c, "v_head_dim", -1);
  s.first_k_dense_replace = int_key(c, "first_k_dense_replace", 0);
  s.n_routed_experts = int_key(c, "n_routed_experts", 0, true);
  for (auto [key, v] : {std::pair{"kv_lora_rank", s.kv_lora_rank}, {"qk_rope_head_dim", s.qk_rope_head_dim},
                        {"v_head_dim", s.v_head_dim}})
    TP_CHECK(v > 0, "{}: '{}' must be positive, got {}", c.source, key, v);
  TP_CHECK(s.qk_rope_head_dim % 2 == 0, "{}: 'qk_rope_head_dim' must be even (RoPE rotates pairs), got {}", c.source,
           s.qk_rope_head_dim);
  TP_CHECK(c.num_key_value_heads == c.num_attention_heads,
           "{}: MLA expands keys and values per query head: 'num_key_value_heads' ({}) must equal "
           "'num_attention_heads' ({})",
           c.source, c.num_key_value_heads, c.num_attention_heads);
  TP_CHECK(!s.is_moe_layer(c.num_hidden_layers - 1),
           "{}: layers {} to {} are mixture-of-experts layers ('first_k_dense_replace' {}, 'n_routed_experts' {}), "
           "which {} does not run yet (the MoE block lands with branch moe); dense layers only: set "
           "first_k_dense_replace >= num_hidden_layers ({}) or n_routed_experts to 0",
           c.source, s.first_k_dense_replace, c.num_hidden_layers - 1, s.first_k_dense_replace, s.n_routed_experts,
           c.model_type, c.num_hidden_layers);
  return s;
}

}  // namespace tp
