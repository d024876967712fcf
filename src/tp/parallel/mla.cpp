#include "tp/parallel/mla.h"

#include "tp/autograd/tape.h"
#include "tp/distributed/functional.h"
#include "tp/ops/shape.h"
#include "tp/parallel/style_util.h"

namespace tp::parallel {

void MlaKvAProjParallel::validate_param(const nn::Module& module, const std::string& param_name,
                                        const Shape& global_shape, const nn::TpRank& tp) const {
  TP_CHECK(options_.qk_rope_head_dim > 0,
           "'{}' has style mla_kv_a_proj, which needs qk_rope_head_dim from the model config, and this model's "
           "config does not define it; add qk_rope_head_dim to config.json or map '{}' to another style",
           module.name(), module.name());
  if (local_param_name(module, param_name) != "weight") return;
  TP_CHECK(global_shape.size() == 2 && global_shape[0] > options_.qk_rope_head_dim,
           "'{}' {} has no room for qk_rope_head_dim {} rope outputs after the latent (style mla_kv_a_proj)",
           param_name, shape_str(global_shape), options_.qk_rope_head_dim);
}

Tensor MlaKvAProjParallel::transform_output_post_forward(nn::Module& module, Tensor output,
                                                         const dist::DeviceMesh& mesh) const {
  if (!autograd::needs_grad({output})) return output;  // inference: nothing to do
  const int64_t n = output.size(-1), rope = options_.qk_rope_head_dim;
  Tensor latent = ops::narrow(output, -1, 0, n - rope);
  Tensor k_pe = dist::copy_to_region(ops::narrow(output, -1, n - rope, rope), mesh.group("tp"));
  return ops::cat({latent, k_pe}, -1);
}

}  // namespace tp::parallel
