// Row-parallel styles.
//
//   Y = X A + b,  A = [A_1; ...; A_p] split by input rows (HF weight [out, in]: columns),
//   X = [X_1, ..., X_p] split the same way; rank r computes X_r A_r, a Partial sum of Y.
// fwd: all-reduce (Partial -> Replicate), then add the replicated bias once
// bwd: none (dY is replicated; dX_r = dY A_r^T is already this rank's slice)
// Under sequence parallelism: fwd reduce-scatter along the sequence (dim 1), then
// the bias on this rank's tokens; bwd all-gather of dY along the sequence.
// rowwise_split_input receives X replicated and keeps its slice (bwd: all-gather dX).
// packed_rowwise splits the input dim of a fused weight group by group (StridedShard).
#include "tp/distributed/functional.h"
#include "tp/ops/elementwise.h"
#include "tp/parallel/rowwise.h"
#include "tp/parallel/style_util.h"

namespace tp::parallel {

void RowwiseParallel::validate_param(const nn::Module& module, const std::string& param_name,
                                     const Shape& global_shape, const nn::TpRank& tp) const {
  if (options_.split_factor > 1 && global_shape.size() >= 2) {
    int64_t n = global_shape.back();
    TP_CHECK(n % options_.split_factor == 0,
             "'{}' has size {} in its last dimension, which is not divisible into {} packed groups (style packed_rowwise)",
             param_name, n, options_.split_factor);
  }
}

nn::ParamShard RowwiseParallel::shard_param(const nn::Module& module, const std::string& param_name,
                                        const Shape& global_shape, const nn::TpRank& tp) const {
  if (global_shape.size() < 2) return {};  // bias: replicated, added after the reduction
  int64_t dim = static_cast<int64_t>(global_shape.size()) - 1;
  if (options_.split_factor > 1) return shard_for(dist::StridedShard{dim, options_.split_factor}, global_shape, tp);
  return shard_for(dist::Shard{dim}, global_shape, tp);
}

void RowwiseParallel::install_forward(nn::Module& module, const nn::TpRank& tp) const {
  if (auto* linear = dynamic_cast<nn::Linear*>(&module)) linear->add_bias_in_forward = false;
}

std::vector<Tensor> RowwiseParallel::transform_inputs_pre_forward(nn::Module& module, std::vector<Tensor> inputs,
                                                                  const dist::DeviceMesh& mesh) const {
  if (!options_.split_input) return inputs;
  for (Tensor& x : inputs) x = dist::scatter_to_region(x, -1, mesh.group("tp"));
  return inputs;
}

Tensor RowwiseParallel::transform_output_post_forward(nn::Module& module, Tensor output,
                                                      const dist::DeviceMesh& mesh) const {
  dist::ProcessGroup& g = mesh.group("tp");
  Tensor y = options_.sequence_parallel ? dist::reduce_scatter_to_region(output, 1, g)
                                        : dist::reduce_from_region(output, g);
  auto* linear = dynamic_cast<nn::Linear*>(&module);
  if (linear != nullptr && linear->bias != nullptr) y = ops::add(y, linear->bias->data);
  return y;
}

std::vector<nn::CollectiveCost> RowwiseParallel::forward_collectives(const nn::Module& module,
                                                                 const nn::TpRank& tp) const {
  return {{options_.sequence_parallel ? "reduce_scatter" : "all_reduce", output_features(module) * 4}};
}

std::shared_ptr<const nn::TensorParallelLayer> RowwiseParallel::sequence_parallel_variant(const nn::Module& module) const {
  return variant_with<RowwiseParallel>(options_, &Options::sequence_parallel);
}

}  // namespace tp::parallel
