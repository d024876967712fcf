#pragma once
#include "tp/parallel/layer.h"

namespace tp::parallel {

// embedding_rowwise: vocab rows split across ranks (Shard(0)). Each rank looks up
// the ids in its range (others give zero rows); fwd all-reduce, bwd none.
// Under sequence parallelism the partial lookup [B, T, H] is reduce-scattered
// along T instead (bwd: all-gather of dY along T).
class EmbeddingRowwise : public TensorParallelLayer {
 public:
  explicit EmbeddingRowwise(bool sequence_parallel = false) : sequence_parallel_(sequence_parallel) {}
  ParamShard shard_param(const nn::Module& module, const std::string& param_name, const Shape& global_shape,
                         const TpRank& tp) const override;
  void install_forward(nn::Module& module, const TpRank& tp) const override;
  Tensor transform_output_post_forward(nn::Module& module, Tensor output, const dist::DeviceMesh& mesh) const override;
  std::vector<CollectiveCost> forward_collectives(const nn::Module& module, const TpRank& tp) const override;
  std::shared_ptr<const TensorParallelLayer> sequence_parallel_variant(const nn::Module& module) const override;

 private:
  bool sequence_parallel_;
};

// embedding_colwise: the hidden dim split across ranks (Shard(1)); fwd all-gather
// of the output, bwd keeps the local slice of the gradient.
class EmbeddingColwise : public TensorParallelLayer {
 public:
  ParamShard shard_param(const nn::Module& module, const std::string& param_name, const Shape& global_shape,
                         const TpRank& tp) const override;
  Tensor transform_output_post_forward(nn::Module& module, Tensor output, const dist::DeviceMesh& mesh) const override;
  std::vector<CollectiveCost> forward_collectives(const nn::Module& module, const TpRank& tp) const override;
  // None: the error names the module.
  std::shared_ptr<const TensorParallelLayer> sequence_parallel_variant(const nn::Module& module) const override;
};

}  // namespace tp::parallel
