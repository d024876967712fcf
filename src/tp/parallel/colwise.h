#pragma once
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>

#include "tp/distributed/process_group.h"
#include "tp/nn/parallel_layer.h"

namespace tp::parallel {

// colwise, colwise_gather_output (colwise_rep), packed_colwise; also the
// KV-head-replicating variant the models use when tp_size > num_key_value_heads.
class ColwiseParallel : public nn::TensorParallelLayer {
 public:
  struct Options {
    bool gather_output = false;  // all-gather the output on the last dim
    int64_t split_factor = 1;    // > 1: packed weight, StridedShard
    int64_t kv_replicas = 1;     // > 1: each slice is held by this many consecutive ranks
    // The input is an all-gather of sequence shards (sequence parallelism), whose
    // backward reduce-scatter sums the ranks' partial input gradients: no
    // all-reduce of dX here.
    bool sequence_parallel = false;
  };
  ColwiseParallel() : ColwiseParallel(Options{}) {}
  explicit ColwiseParallel(Options options);
  const Options& options() const { return options_; }

  void validate_param(const nn::Module& module, const std::string& param_name, const Shape& global_shape,
                      const nn::TpRank& tp) const override;
  nn::ParamShard shard_param(const nn::Module& module, const std::string& param_name, const Shape& global_shape,
                         const nn::TpRank& tp) const override;
  std::vector<Tensor> transform_inputs_pre_forward(nn::Module& module, std::vector<Tensor> inputs,
                                                   const dist::DeviceMesh& mesh) const override;
  // With kv_replicas > 1 and gradients on: the ranks holding one slice each see
  // only their own query heads' part of its gradient, so the parameters'
  // gradients are summed over those ranks (fwd identity).
  Tensor context_around_forward(nn::Module& module, const std::function<Tensor()>& forward,
                                const dist::DeviceMesh& mesh) const override;
  Tensor transform_output_post_forward(nn::Module& module, Tensor output, const dist::DeviceMesh& mesh) const override;
  std::vector<nn::CollectiveCost> forward_collectives(const nn::Module& module, const nn::TpRank& tp) const override;
  std::shared_ptr<const nn::TensorParallelLayer> sequence_parallel_variant(const nn::Module& module) const override;
  // Its input hook passes the input through and, unless gathered, the output stays this rank's slice.
  bool allows_fused_forward() const override { return !options_.gather_output; }

 protected:
  dist::Placement placement_for(const Shape& global_shape) const;
  Options options_;

 private:
  // The ranks that hold this rank's slice (kv_replicas consecutive ranks), made
  // on first use (a collective split of the mesh's group) and kept.
  dist::ProcessGroup& replica_group(const dist::DeviceMesh& mesh) const;
  mutable std::mutex mutex_;
  mutable std::map<const dist::DeviceMesh*, std::shared_ptr<dist::ProcessGroup>> replica_groups_;
};

}  // namespace tp::parallel
