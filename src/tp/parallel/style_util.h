#pragma once
// Helpers shared by the style families.
#include "tp/distributed/device_mesh.h"
#include "tp/distributed/placement.h"
#include "tp/nn/layers.h"
#include "tp/nn/parallel_layer.h"

namespace tp::parallel {

// The slice `placement` gives this rank of a tensor of `global_shape` on a 1-D mesh.
nn::ParamShard shard_for(const dist::Placement& placement, const Shape& global_shape, const nn::TpRank& tp);

// "weight" / "bias" from a full parameter name.
std::string local_param_name(const nn::Module& module, const std::string& param_name);

// The module as a Linear/Embedding, or an error naming the module and the style.
nn::Linear& as_linear(nn::Module& module, const char* style);
nn::Embedding& as_embedding(nn::Module& module, const char* style);

// Output width of a Linear or Embedding (0 for other modules), for cost estimates.
int64_t output_features(const nn::Module& module);

// A style's sequence-parallel form: the style again with `options.*flag` set;
// null when it is set already (the style is that form).
template <class Style>
std::shared_ptr<const nn::TensorParallelLayer> variant_with(const typename Style::Options& options,
                                                       bool Style::Options::*flag) {
  if (options.*flag) return nullptr;
  typename Style::Options o = options;
  o.*flag = true;
  return std::make_shared<Style>(o);
}

// fwd identity / bwd all-reduce over `group` of each parameter's gradient, for
// styles whose replicated parameters see only part of the data on each rank.
Tensor with_grad_allreduced_params(nn::Module& module, const std::function<Tensor()>& forward,
                                   dist::ProcessGroup& group);

}  // namespace tp::parallel
