#include "tp/models/rope_config.h"

#include <cmath>

namespace tp {

ops::YarnRope yarn_rope_for(const ModelConfig& c, int64_t rotary_dim) {
  const RopeScalingConfig& rs = c.rope_scaling;
  TP_CHECK(rs.rope_type == "yarn", "{}: yarn_rope_for on rope_scaling type '{}'", c.source, rs.rope_type);
  ops::YarnScaling y;
  y.original_max_position_embeddings =
      rs.original_max_position_embeddings > 0 ? rs.original_max_position_embeddings : c.max_position_embeddings;
  y.factor = rs.original_max_position_embeddings > 0
                 ? static_cast<double>(c.max_position_embeddings) / static_cast<double>(rs.original_max_position_embeddings)
                 : rs.factor;
  y.beta_fast = rs.beta_fast;
  y.beta_slow = rs.beta_slow;
  y.truncate = rs.truncate.value_or(true);
  y.attention_factor = rs.attention_factor.value_or(0);
  y.mscale = rs.mscale.value_or(0);
  y.mscale_all_dim = rs.mscale_all_dim.value_or(0);
  return ops::rope_yarn(rotary_dim, c.rope_theta, y);
}

LongRope longrope_for(const ModelConfig& c, int64_t rotary_dim, int64_t absent_original) {
  const RopeScalingConfig& rs = c.rope_scaling;
  TP_CHECK(rs.rope_type == "longrope", "{}: longrope_for on rope_scaling type '{}'", c.source, rs.rope_type);
  LongRope r;
  r.original_max_position_embeddings = rs.original_max_position_embeddings;
  if (r.original_max_position_embeddings <= 0) {
    auto it = c.raw.find("original_max_position_embeddings");
    if (it != c.raw.end() && !it->is_null()) {
      TP_CHECK(it->is_number_integer() && it->get<int64_t>() > 0,
               "{}: 'original_max_position_embeddings' must be a positive integer, got {}", c.source, it->dump());
      r.original_max_position_embeddings = it->get<int64_t>();
    } else {
      r.original_max_position_embeddings = absent_original > 0 ? absent_original : c.max_position_embeddings;
    }
  }
  // Transformers 5 reads the file's factor when there is one; without it (Phi-3's
  // files) the factor is the ratio of the two context lengths.
  const double factor = rs.factor_given ? rs.factor
                                        : static_cast<double>(c.max_position_embeddings) /
                                              static_cast<double>(r.original_max_position_embeddings);
  if (rs.attention_factor)
    r.attention_factor = *rs.attention_factor;
  else if (factor > 1.0)
    r.attention_factor =
        std::sqrt(1.0 + std::log(factor) / std::log(static_cast<double>(r.original_max_position_embeddings)));
  const std::vector<float> base = ops::rope_inv_freq(rotary_dim, c.rope_theta);
  auto scaled = [&](const std::vector<double>& ext, const char* key) {
    TP_CHECK(ext.size() == base.size(),
             "{}: rope_scaling '{}' has {} entries; the rotary dim {} needs {} (one per frequency)", c.source, key,
             ext.size(), rotary_dim, base.size());
    std::vector<float> inv(base.size());
    for (size_t i = 0; i < inv.size(); ++i) {
      // f32 as torch: 1.0 / (ext_factors * base ** (arange(0, dim, 2).float() / dim)).
      const float pos_freq =
          std::pow(static_cast<float>(c.rope_theta), static_cast<float>(2 * i) / static_cast<float>(rotary_dim));
      inv[i] = 1.0f / (static_cast<float>(ext[i]) * pos_freq);
    }
    return inv;
  };
  r.short_inv_freq = scaled(rs.short_factor, "short_factor");
  r.long_inv_freq = scaled(rs.long_factor, "long_factor");
  return r;
}

}  // namespace tp
