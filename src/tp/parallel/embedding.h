#pragma once
#include "tp/nn/parallel_layer.h"

namespace tp::parallel {

// embedding_rowwise: vocab rows split across ranks (Shard(0)). Each rank looks up
// the ids in its range (others give zero rows); fwd all-reduce, bwd none.
// Under sequence parallelism the partial lookup [B, T, H] is reduce-scattered
// along T instead (bwd: all-gather of dY along T).
class EmbeddingRowwise : public nn::TensorParallelLayer {
 public:
  explicit EmbeddingRowwise(bool sequence_parallel = false) : sequence_parallel_(sequence_parallel) {}
  nn::ParamShard shard_param(const nn::Module& module, const std::string& param_name, const Shape& global_shape,
                         const nn::TpRank& tp) const override;
  void install_forward(nn::Module& module, const nn::TpRank& tp) const override;
  Tensor transform_output_post_forward(nn::Module& module, Tensor output, const dist::DeviceMesh& mesh) const override;
  std::vector<nn::CollectiveCost> forward_collectives(const nn::Module& module, const nn::TpRank& tp) const override;
  std::shared_ptr<const nn::TensorParallelLayer> sequence_parallel_variant(const nn::Module& module) const override;

 private:
  bool sequence_parallel_;
};

// embedding_colwise: the hidden dim split across ranks (Shard(1)); fwd all-gather
// of the output, bwd keeps the local slice of the gradient.
class EmbeddingColwise : public nn::TensorParallelLayer {
 public:
  nn::ParamShard shard_param(const nn::Module& module, const std::string& param_name, const Shape& global_shape,
                         const nn::TpRank& tp) const override;
  Tensor transform_output_post_forward(nn::Module& module, Tensor output, const dist::DeviceMesh& mesh) const override;
  std::vector<nn::CollectiveCost> forward_collectives(const nn::Module& module, const nn::TpRank& tp) const override;
  // None: the error names the module.
  std::shared_ptr<const nn::TensorParallelLayer> sequence_parallel_variant(const nn::Module& module) const override;
};

}  // namespace tp::parallel
