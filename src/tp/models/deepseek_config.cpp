#include "tp/models/deepseek_config.h"

#include <algorithm>

#include "tp/models/moe.h"
#include "tp/core/error.h"

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
  for (auto [key, v] : {std::pair{"qk_nope_head_dim", s.qk_nope_head_dim}, {"qk_rope_head_dim", s.qk_rope_head_dim},
                        {"v_head_dim", s.v_head_dim}})
    check_head_dim(c.source, fmt::format("'{}'", key).c_str(), v);
  TP_CHECK(s.qk_rope_head_dim % 2 == 0, "{}: 'qk_rope_head_dim' must be even (RoPE rotates pairs), got {}", c.source,
           s.qk_rope_head_dim);
  TP_CHECK(c.num_key_value_heads == c.num_attention_heads,
           "{}: MLA expands keys and values per query head: 'num_key_value_heads' ({}) must equal "
           "'num_attention_heads' ({})",
           c.source, c.num_key_value_heads, c.num_attention_heads);
  s.v3 = c.model_type == "deepseek_v3";
  if (auto it = c.raw.find("rope_interleave"); s.v3 && it != c.raw.end() && !it->is_null()) {
    TP_CHECK(it->is_boolean(), "{}: 'rope_interleave' must be true or false, got {}", c.source, it->dump());
    s.rope_interleave = it->get<bool>();
  }
  return s;
}

MoeConfig deepseek_moe_config(const ModelConfig& c, const DeepseekSizes& s) {
  MoeConfig m;
  m.num_experts = s.n_routed_experts;
  for (int64_t i = 0; i < std::min(s.first_k_dense_replace, c.num_hidden_layers); ++i) m.mlp_only_layers.push_back(i);
  if (!s.is_moe_layer(c.num_hidden_layers - 1)) return m;  // dense layers only: the MoE keys are not read
  m.top_k = int_key(c, "num_experts_per_tok", -1);
  m.expert_intermediate = int_key(c, "moe_intermediate_size", -1);
  m.shared_intermediate = m.expert_intermediate * int_key(c, "n_shared_experts", 0, true);
  for (auto [key, v] : {std::pair{"num_experts_per_tok", m.top_k}, {"moe_intermediate_size", m.expert_intermediate}})
    TP_CHECK(v > 0, "{}: '{}' must be positive, got {}", c.source, key, v);
  TP_CHECK(m.top_k <= m.num_experts, "{}: 'num_experts_per_tok' ({}) is more than the {} experts ('n_routed_experts')",
           c.source, m.top_k, m.num_experts);
  const std::string want_scoring = s.v3 ? "sigmoid" : "softmax";
  const std::string scoring = c.raw_string("scoring_func", want_scoring);
  TP_CHECK(scoring == want_scoring, "{}: scoring_func '{}' is not supported for {}; supported: {}", c.source, scoring,
           c.model_type, want_scoring);
  const std::string method = c.raw_string("topk_method", s.v3 ? "noaux_tc" : "greedy");
  TP_CHECK(s.v3 ? method == "noaux_tc" : (method == "greedy" || method == "group_limited_greedy"),
           "{}: topk_method '{}' is not supported for {}; supported: {}", c.source, method, c.model_type,
           s.v3 ? "noaux_tc" : "greedy, group_limited_greedy");
  nn::RouterScoring& r = m.scoring;
  r.top_k = m.top_k;
  r.sigmoid = s.v3;
  // Transformers' DeepseekV2 never renormalises (it ignores norm_topk_prob); V3 does when norm_topk_prob.
  r.renormalize = m.norm_topk_prob = s.v3 && c.raw_bool("norm_topk_prob", true);
  r.group_sum_top2 = s.v3;
  if (method != "greedy") {
    r.n_group = int_key(c, "n_group", 1, true);
    r.topk_group = int_key(c, "topk_group", 1, true);
    TP_CHECK(r.n_group >= 1 && m.num_experts % r.n_group == 0,
             "{}: 'n_group' ({}) must divide 'n_routed_experts' ({}) for topk_method {}", c.source, r.n_group,
             m.num_experts, method);
    TP_CHECK(r.topk_group >= 1 && r.topk_group <= r.n_group, "{}: 'topk_group' ({}) must be in [1, n_group = {}]",
             c.source, r.topk_group, r.n_group);
    TP_CHECK(m.top_k <= r.topk_group * (m.num_experts / r.n_group),
             "{}: 'num_experts_per_tok' ({}) is more than the {} experts of the 'topk_group' ({}) groups kept",
             c.source, m.top_k, r.topk_group * (m.num_experts / r.n_group), r.topk_group);
    TP_CHECK(!s.v3 || r.n_group == 1 || m.num_experts / r.n_group >= 2,
             "{}: noaux_tc scores a group by its two best experts: 'n_routed_experts' / 'n_group' must be at least "
             "2, got {} / {}", c.source, m.num_experts, r.n_group);
  }
  if (auto it = c.raw.find("routed_scaling_factor"); it != c.raw.end() && !it->is_null()) {
    TP_CHECK(it->is_number() && it->get<double>() > 0, "{}: 'routed_scaling_factor' must be a positive number, got {}",
             c.source, it->dump());
    r.scaling = it->get<double>();
  }
  m.score_correction_bias = s.v3;
  if (auto it = c.raw.find("router_aux_loss_coef"); it != c.raw.end() && it->is_number())
    m.router_aux_loss_coef = it->get<double>();
  return m;
}

}  // namespace tp
