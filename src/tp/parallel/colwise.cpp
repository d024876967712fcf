// Column-parallel styles.
//
//   Y = X A + b,  A = [A_1, ..., A_p] split by output columns (HF weight [out, in]: rows),
//   rank r computes Y_r = X A_r + b_r, a Shard(-1) piece of Y.
// fwd: input identity (X replicated)   bwd: all-reduce dX (each rank holds a partial sum)
// colwise_gather_output also all-gathers Y (bwd: keeps the local slice of dY).
// Under sequence parallelism X comes from an all-gather along the sequence whose
// backward reduce-scatter does the reduction of dX instead (once per block).
// With KV heads replicated (tp > kv heads), a slice's ranks also sum its
// parameters' gradients, each having seen only its own query heads' part.
// packed_colwise cuts a fused weight (e.g. gate_up_proj) into split_factor groups
// first, so rank r holds matching slices of every group: StridedShard.
#include "tp/autograd/tape.h"
#include "tp/distributed/functional.h"
#include "tp/parallel/colwise.h"
#include "tp/parallel/style_util.h"

namespace tp::parallel {

ColwiseParallel::ColwiseParallel(Options options) : options_(options) {}

dist::Placement ColwiseParallel::placement_for(const Shape& global_shape) const {
  // Linear weight [out, in] -> dim 0; 3-D expert weights [E, out, in] -> dim 1; bias [out] -> dim 0.
  int64_t dim = global_shape.size() >= 2 ? static_cast<int64_t>(global_shape.size()) - 2 : 0;
  if (options_.split_factor > 1) return dist::StridedShard{dim, options_.split_factor};
  return dist::Shard{dim};
}

void ColwiseParallel::validate_param(const nn::Module& module, const std::string& param_name,
                                     const Shape& global_shape, const nn::TpRank& tp) const {
  int64_t tp_size = tp.size;
  int64_t dim = global_shape.size() >= 2 ? static_cast<int64_t>(global_shape.size()) - 2 : 0;
  int64_t n = global_shape.empty() ? 0 : global_shape[dim];
  if (options_.gather_output && local_param_name(module, param_name) == "weight")
    TP_CHECK(n % tp_size == 0,
             "The output size of '{}' ({}) must be divisible by the tensor parallel size ({}) when gathering a "
             "colwise output (style colwise_gather_output)",
             module.name(), n, tp_size);
  if (options_.split_factor > 1)
    TP_CHECK(n % options_.split_factor == 0, "'{}' has size {} in dimension {}, which is not divisible into {} packed "
             "groups (style packed_colwise)", param_name, n, dim, options_.split_factor);
  if (options_.kv_replicas > 1)
    TP_CHECK(tp_size % options_.kv_replicas == 0, "tp_size {} is not a multiple of the KV-head replication factor {} for '{}'",
             tp_size, options_.kv_replicas, param_name);
}

nn::ParamShard ColwiseParallel::shard_param(const nn::Module& module, const std::string& param_name,
                                        const Shape& global_shape, const nn::TpRank& tp) const {
  dist::Placement p = placement_for(global_shape);
  if (options_.kv_replicas <= 1) return shard_for(p, global_shape, tp);
  // Each KV head lives on kv_replicas consecutive ranks: split into tp / r parts.
  nn::ParamShard s;
  s.placement = p;
  s.dim = std::get<dist::Shard>(p).dim;
  int64_t parts = tp.size / options_.kv_replicas;
  s.spans = {chunk_span(global_shape[s.dim], parts, tp.rank / options_.kv_replicas)};
  return s;
}

std::vector<Tensor> ColwiseParallel::transform_inputs_pre_forward(nn::Module& module, std::vector<Tensor> inputs,
                                                                  const dist::DeviceMesh& mesh) const {
  if (options_.sequence_parallel) return inputs;
  for (Tensor& x : inputs) x = dist::copy_to_region(x, mesh.group("tp"));
  return inputs;
}

dist::ProcessGroup& ColwiseParallel::replica_group(const dist::DeviceMesh& mesh) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::shared_ptr<dist::ProcessGroup>& g = replica_groups_[&mesh];
  if (g == nullptr) {
    dist::ProcessGroup& tp = mesh.group("tp");
    g = tp.split(static_cast<int>(tp.rank() / options_.kv_replicas), tp.rank());
  }
  return *g;
}

Tensor ColwiseParallel::context_around_forward(nn::Module& module, const std::function<Tensor()>& forward,
                                               const dist::DeviceMesh& mesh) const {
  if (options_.kv_replicas <= 1) return forward();
  std::vector<Tensor> params;
  for (nn::Parameter* p : module.own_parameters()) params.push_back(p->data);
  // Every rank of a model agrees on whether gradients are on, so the split stays collective.
  if (!autograd::needs_grad(params)) return forward();
  return with_grad_allreduced_params(module, forward, replica_group(mesh));
}

Tensor ColwiseParallel::transform_output_post_forward(nn::Module& module, Tensor output,
                                                      const dist::DeviceMesh& mesh) const {
  if (!options_.gather_output) return output;
  return dist::gather_from_region(output, -1, mesh.group("tp"));
}

std::vector<nn::CollectiveCost> ColwiseParallel::forward_collectives(const nn::Module& module,
                                                                 const nn::TpRank& tp) const {
  if (!options_.gather_output) return {};
  return {{"all_gather", output_features(module) * 4}};
}

std::shared_ptr<const nn::TensorParallelLayer> ColwiseParallel::sequence_parallel_variant(const nn::Module& module) const {
  return variant_with<ColwiseParallel>(options_, &Options::sequence_parallel);
}

}  // namespace tp::parallel
