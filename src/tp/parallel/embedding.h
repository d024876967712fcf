#pragma once
#include "tp/parallel/layer.h"

namespace tp::parallel {

// embedding_rowwise: vocab rows split across ranks (Shard(0)). Each rank looks up
// the ids in its range (others give zero rows); fwd all-reduce, bwd none.
class EmbeddingRowwise : public TensorParallelLayer {
 public:
  ParamShard shard_param(const nn::Module& module, const std::string& param_name, const Shape& global_shape,
                         const TpRank& tp) const override;
  void install_forward(nn::Module& module, const TpRank& tp) const override;
  Tensor transform_output_post_forward(nn::Module& module, Tensor output, const dist::DeviceMesh& mesh) const override;
  std::vector<CollectiveCost> forward_collectives(const nn::Module& module, const TpRank& tp) const override;
};

// embedding_colwise: the hidden dim split across ranks (Shard(1)); fwd all-gather
// of the output, bwd keeps the local slice of the gradient.
class EmbeddingColwise : public TensorParallelLayer {
 public:
  ParamShard shard_param(const nn::Module& module, const std::string& param_name, const Shape& global_shape,
                         const TpRank& tp) const override;
  Tensor transform_output_post_forward(nn::Module& module, Tensor output, const dist::DeviceMesh& mesh) const override;
  std::vector<CollectiveCost> forward_collectives(const nn::Module& module, const TpRank& tp) const override;
};

}  // namespace tp::parallel
