#pragma once
// Sequence-parallel styles (Megatron's sequence parallelism, torch's
// SequenceParallel). With DistributedConfig::enable_sequence_parallel the
// activations between blocks are sequence shards, Shard(1) of [B, T, H] (the
// chunk rule: rank r holds chunk_span(T, tp, r), possibly none): the model's
// sequence-parallel plan puts these styles on its norms, its blocks and a
// replicated embedding, and every style of the plan runs in its
// sequence-parallel form (nn::TensorParallelLayer::sequence_parallel_variant):
//
//   embed_tokens     replicated: keep this rank's tokens (bwd all-gather);
//                    vocab-parallel: reduce-scatter (bwd all-gather)
//   norms            on this rank's tokens; weights replicated, gradients all-reduced
//   self_attn, mlp   all-gather the sequence once on entry (bwd reduce-scatter);
//                    their column-parallel projections then reduce nothing
//   o_proj, down_proj   reduce-scatter along the sequence (bwd all-gather)
//   final norm       on this rank's tokens, then all-gather (bwd reduce-scatter), for lm_head
#include <cstdint>

#include "tp/parallel/apply.h"
#include "tp/nn/parallel_layer.h"

namespace tp::parallel {

// sequence_parallel: parameters replicated and their gradients all-reduced (each
// rank sees only its tokens); the replicated input is split on the sequence dim
// (fwd: keep the local chunk / bwd: all-gather), the output stays sequence-sharded.
// Under sequence parallelism the input already is this rank's shard: no split.
// sequence_parallel_gather_output: the same, and the output is all-gathered along
// the sequence (the final norm before lm_head).
class SequenceParallel : public nn::TensorParallelLayer {
 public:
  struct Options {
    int64_t sequence_dim = 1;
    bool gather_output = false;
    bool sharded_input = false;  // the sequence-parallel form
  };
  SequenceParallel() : SequenceParallel(Options{}) {}
  explicit SequenceParallel(Options options) : options_(options) {}
  std::vector<Tensor> transform_inputs_pre_forward(nn::Module& module, std::vector<Tensor> inputs,
                                                   const dist::DeviceMesh& mesh) const override;
  Tensor context_around_forward(nn::Module& module, const std::function<Tensor()>& forward,
                                const dist::DeviceMesh& mesh) const override;
  // The gather's backward: the slice of an already reduced gradient (the consumer,
  // a column-parallel lm_head, all-reduced it), or, in the sequence-parallel form,
  // a reduce-scatter of the consumer's partial gradients.
  Tensor transform_output_post_forward(nn::Module& module, Tensor output, const dist::DeviceMesh& mesh) const override;
  std::vector<nn::CollectiveCost> forward_collectives(const nn::Module& module, const nn::TpRank& tp) const override;
  std::shared_ptr<const nn::TensorParallelLayer> sequence_parallel_variant(const nn::Module& module) const override;

 private:
  Options options_;
};

// gather_sequence_input: a block (attention, MLP) whose input arrives as sequence
// shards: fwd all-gather along the sequence / bwd reduce-scatter, once for all of
// its column-parallel projections. Without sequence parallelism the input is
// whole already: nothing to do.
class GatherSequenceInput : public nn::TensorParallelLayer {
 public:
  explicit GatherSequenceInput(bool active = false) : active_(active) {}
  std::vector<Tensor> transform_inputs_pre_forward(nn::Module& module, std::vector<Tensor> inputs,
                                                   const dist::DeviceMesh& mesh) const override;
  std::vector<nn::CollectiveCost> forward_collectives(const nn::Module& module, const nn::TpRank& tp) const override;
  std::shared_ptr<const nn::TensorParallelLayer> sequence_parallel_variant(const nn::Module& module) const override;

 private:
  bool active_;
};

// scatter_sequence_output: a replicated module (an embedding no style splits)
// whose output enters the sequence-sharded region: fwd keep this rank's tokens /
// bwd all-gather, so its replicated weight still gets the whole gradient. Without
// sequence parallelism: nothing to do.
class ScatterSequenceOutput : public nn::TensorParallelLayer {
 public:
  explicit ScatterSequenceOutput(bool active = false) : active_(active) {}
  Tensor transform_output_post_forward(nn::Module& module, Tensor output, const dist::DeviceMesh& mesh) const override;
  std::shared_ptr<const nn::TensorParallelLayer> sequence_parallel_variant(const nn::Module& module) const override;

 private:
  bool active_;
};

// Adds to `overrides` the sequence-parallel form of the style of every module of
// `root` that `plan` styles (an override already there, e.g. KV-head replication,
// is turned too). Errors name a module whose style has none.
void use_sequence_parallel_styles(const ResolvedPlan& plan, nn::Module& root, StyleOverrides& overrides);

}  // namespace tp::parallel
