#pragma once
#include <cstdint>

#include "tp/parallel/layer.h"

namespace tp::parallel {

// replicated_with_grad_allreduce: parameters replicated, no forward
// communication; each rank's parameter gradient covers only its share of the
// work (e.g. Qwen3's q_norm/k_norm over this rank's heads), so backward
// all-reduces it.
class ReplicatedWithGradAllreduce : public TensorParallelLayer {
 public:
  Tensor context_around_forward(nn::Module& module, const std::function<Tensor()>& forward,
                                const dist::DeviceMesh& mesh) const override;
};

// sequence_parallel: parameters replicated; the replicated input is split on
// the sequence dim (fwd: keep the local chunk / bwd: all-gather), the output
// stays sequence-sharded, and parameter gradients are all-reduced.
class SequenceParallel : public TensorParallelLayer {
 public:
  explicit SequenceParallel(int64_t sequence_dim = 1) : sequence_dim_(sequence_dim) {}
  std::vector<Tensor> transform_inputs_pre_forward(nn::Module& module, std::vector<Tensor> inputs,
                                                   const dist::DeviceMesh& mesh) const override;
  Tensor context_around_forward(nn::Module& module, const std::function<Tensor()>& forward,
                                const dist::DeviceMesh& mesh) const override;

 private:
  int64_t sequence_dim_;
};

// all_reduce: the module's output is a partial sum; fwd all-reduce, bwd none.
class AllReduceOutput : public TensorParallelLayer {
 public:
  Tensor transform_output_post_forward(nn::Module& module, Tensor output, const dist::DeviceMesh& mesh) const override;
  std::vector<CollectiveCost> forward_collectives(const nn::Module& module, const TpRank& tp) const override;
};

// local_params: the module's parameters are sharded by their own plan entries
// and its forward runs on the local tensors with no communication.
class LocalParams : public TensorParallelLayer {};

}  // namespace tp::parallel
