#pragma once
#include <cstdint>

#include "tp/nn/parallel_layer.h"

namespace tp::parallel {

// replicated_with_grad_allreduce: parameters replicated, no forward
// communication; each rank's parameter gradient covers only its share of the
// work (e.g. Qwen3's q_norm/k_norm over this rank's heads), so backward
// all-reduces it.
class ReplicatedWithGradAllreduce : public nn::TensorParallelLayer {
 public:
  Tensor context_around_forward(nn::Module& module, const std::function<Tensor()>& forward,
                                const dist::DeviceMesh& mesh) const override;
};

// all_reduce: the module's output is a partial sum; fwd all-reduce, bwd none.
class AllReduceOutput : public nn::TensorParallelLayer {
 public:
  Tensor transform_output_post_forward(nn::Module& module, Tensor output, const dist::DeviceMesh& mesh) const override;
  std::vector<nn::CollectiveCost> forward_collectives(const nn::Module& module, const nn::TpRank& tp) const override;
  // None yet (a Partial output on sequence shards would be reduce-scattered): the error names the module.
  std::shared_ptr<const nn::TensorParallelLayer> sequence_parallel_variant(const nn::Module& module) const override;
};

// local_params: the module's parameters are sharded by their own plan entries
// and its forward runs on the local tensors with no communication.
class LocalParams : public nn::TensorParallelLayer {};

}  // namespace tp::parallel
