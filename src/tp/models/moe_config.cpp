// MoeConfig: config.json's MoE keys, under the names the architecture gives them (MoeKeys).
#include <algorithm>

#include "tp/models/moe.h"

namespace tp {

namespace {

int64_t positive_int(const ModelConfig& c, const char* key) {
  auto it = c.raw.find(key);
  TP_CHECK(it != c.raw.end() && it->is_number_integer() && it->get<int64_t>() >= 1,
           "{}: '{}' must be a positive integer for model_type {}, got {}", c.source, key, c.model_type,
           it == c.raw.end() ? std::string("nothing") : it->dump());
  return it->get<int64_t>();
}

}  // namespace

MoeConfig MoeConfig::from(const ModelConfig& c, const MoeKeys& keys) {
  MoeConfig m;
  m.gpt_oss = keys.gpt_oss;
  m.num_experts = positive_int(c, keys.num_experts);
  m.top_k = positive_int(c, "num_experts_per_tok");
  TP_CHECK(m.top_k <= m.num_experts, "{}: 'num_experts_per_tok' ({}) is more than the {} experts", c.source, m.top_k,
           m.num_experts);
  m.expert_intermediate = positive_int(c, keys.expert_intermediate);
  m.norm_topk_prob = keys.always_renormalize || c.raw_bool("norm_topk_prob", false);
  if (m.gpt_oss) {
    m.router_name = "router";
    if (auto it = c.raw.find("swiglu_limit"); it != c.raw.end()) {
      TP_CHECK(it->is_number() && it->get<double>() > 0, "{}: 'swiglu_limit' must be a positive number, got {}",
               c.source, it->dump());
      m.swiglu_limit = it->get<double>();
    }
  }
  if (keys.sparse_layer_keys) {
    m.decoder_sparse_step = c.raw.contains("decoder_sparse_step") ? positive_int(c, "decoder_sparse_step") : 1;
    if (auto it = c.raw.find("mlp_only_layers"); it != c.raw.end() && !it->is_null()) {
      TP_CHECK(it->is_array(), "{}: 'mlp_only_layers' must be a list of layer indices, got {}", c.source, it->dump());
      for (const auto& v : *it) {
        TP_CHECK(v.is_number_integer(), "{}: 'mlp_only_layers' must hold layer indices, got {}", c.source, v.dump());
        m.mlp_only_layers.push_back(v.get<int64_t>());
      }
    }
  }
  if (auto it = c.raw.find("router_aux_loss_coef"); it != c.raw.end() && it->is_number())
    m.router_aux_loss_coef = it->get<double>();
  m.output_router_logits = c.raw_bool("output_router_logits", false);
  m.scoring = {.top_k = m.top_k, .renormalize = m.norm_topk_prob, .top_k_then_softmax = m.gpt_oss};
  return m;
}

bool MoeConfig::is_sparse_layer(int64_t layer) const {
  if (std::find(mlp_only_layers.begin(), mlp_only_layers.end(), layer) != mlp_only_layers.end()) return false;
  return num_experts > 0 && (layer + 1) % decoder_sparse_step == 0;
}

}  // namespace tp
