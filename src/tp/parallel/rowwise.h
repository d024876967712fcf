#pragma once
#include <cstdint>

#include "tp/nn/parallel_layer.h"

namespace tp::parallel {

// rowwise, rowwise_split_input (rowwise_rep), packed_rowwise.
class RowwiseParallel : public nn::TensorParallelLayer {
 public:
  struct Options {
    bool split_input = false;  // input arrives replicated: keep this rank's slice of its last dim
    int64_t split_factor = 1;  // > 1: packed weight, StridedShard on the last dim
    // Sequence parallelism: the output of [B, T, ...] is reduce-scattered along T
    // (Partial -> Shard(1)) instead of all-reduced.
    bool sequence_parallel = false;
  };
  RowwiseParallel() : RowwiseParallel(Options{}) {}
  explicit RowwiseParallel(Options options) : options_(options) {}

  void validate_param(const nn::Module& module, const std::string& param_name, const Shape& global_shape,
                      const nn::TpRank& tp) const override;
  nn::ParamShard shard_param(const nn::Module& module, const std::string& param_name, const Shape& global_shape,
                         const nn::TpRank& tp) const override;
  void install_forward(nn::Module& module, const nn::TpRank& tp) const override;
  std::vector<Tensor> transform_inputs_pre_forward(nn::Module& module, std::vector<Tensor> inputs,
                                                   const dist::DeviceMesh& mesh) const override;
  Tensor transform_output_post_forward(nn::Module& module, Tensor output, const dist::DeviceMesh& mesh) const override;
  std::vector<nn::CollectiveCost> forward_collectives(const nn::Module& module, const nn::TpRank& tp) const override;
  std::shared_ptr<const nn::TensorParallelLayer> sequence_parallel_variant(const nn::Module& module) const override;

 private:
  Options options_;
};

}  // namespace tp::parallel
