#include "tp/models/rope_config.h"

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

}  // namespace tp
