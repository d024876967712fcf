#pragma once
// TensorParallelLayer: what a parallel style does to one module, as hooks that
// default to no-ops (the seeds' interface).
//
// Load time, before any weight is read:
//   validate_param  — may the parameter be split this way on this mesh? (error names it)
//   shard_param     — which slice of the checkpoint tensor this rank loads
//   install_forward — one-time changes to the module (e.g. defer a bias)
// Forward, around the module's own forward (run_forward):
//   transform_inputs_pre_forward -> context_around_forward(forward) -> transform_output_post_forward
// Each transform is a differentiable collective (tp/distributed/functional.h), so the
// backward communication of a style is the adjoint of its forward.
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "tp/distributed/device_mesh.h"
#include "tp/distributed/placement.h"
#include "tp/tensor/tensor.h"

namespace tp::nn {

class Module;

// The slice of a checkpoint tensor one rank owns.
struct ParamShard {
  dist::Placement placement = dist::Replicate{};
  int64_t dim = 0;                // dimension the spans cut (unused when replicated)
  std::vector<ChunkSpan> spans;   // concatenated along `dim` (several for StridedShard)
  bool replicated() const { return spans.empty(); }
};

// Where this rank sits in the tensor-parallel dimension (and the expert-parallel
// one, whose styles shard the expert dim). Load-time hooks need only this, so
// `tp plan` can ask them about every rank without starting any.
struct TpRank {
  int64_t size = 1;
  int64_t rank = 0;
  int64_t ep_size = 1;
  int64_t ep_rank = 0;
};

// One collective a style runs per forward, for `tp plan`'s communication table.
struct CollectiveCost {
  std::string op;               // "all_reduce", "all_gather", "reduce_scatter", "all_to_all"
  int64_t bytes_per_token = 0;  // f32 activation bytes entering the collective, per token
};

class TensorParallelLayer {
 public:
  virtual ~TensorParallelLayer() = default;

  virtual void validate_param(const Module& module, const std::string& param_name, const Shape& global_shape,
                              const TpRank& tp) const {}
  virtual ParamShard shard_param(const Module& module, const std::string& param_name, const Shape& global_shape,
                                 const TpRank& tp) const {
    return {};
  }
  virtual void install_forward(Module& module, const TpRank& tp) const {}

  virtual std::vector<Tensor> transform_inputs_pre_forward(Module& module, std::vector<Tensor> inputs,
                                                           const dist::DeviceMesh& mesh) const {
    return inputs;
  }
  virtual Tensor context_around_forward(Module& module, const std::function<Tensor()>& forward,
                                        const dist::DeviceMesh& mesh) const {
    return forward();
  }
  virtual Tensor transform_output_post_forward(Module& module, Tensor output, const dist::DeviceMesh& mesh) const {
    return output;
  }
  // One call of the module under this style: the three hooks above in turn
  // around `forward`. A style whose output hook needs what its input hook
  // worked out (the routes of dispatched tokens) overrides this instead and
  // keeps that on its own stack: nothing of one call stays on the module.
  virtual Tensor run_forward(Module& module, std::vector<Tensor> inputs,
                             const std::function<Tensor(const std::vector<Tensor>&)>& forward,
                             const dist::DeviceMesh& mesh) const {
    inputs = transform_inputs_pre_forward(module, std::move(inputs), mesh);
    Tensor out = context_around_forward(module, [&] { return forward(inputs); }, mesh);
    return transform_output_post_forward(module, std::move(out), mesh);
  }
  // Modules always hold this rank's local tensors; a style that wanted the
  // global DTensor view would say false (none of the shipped ones do).
  virtual bool should_use_local_tensors() const { return true; }

  // For `tp plan`: collectives per forward of a module with this style.
  virtual std::vector<CollectiveCost> forward_collectives(const Module& module, const TpRank& tp) const {
    return {};
  }

  // May the module run inside one fused GEMM with its siblings (q|k|v,
  // gate|up)? Only where its forward under this style is the plain local
  // product: the input passed through without a collective, the output left as
  // this rank's slice. (Fused GEMMs run only without gradients.)
  virtual bool allows_fused_forward() const { return false; }

  // Under sequence parallelism (DistributedConfig::enable_sequence_parallel) the
  // activations between blocks are sequence shards: the style that serves
  // `module` there instead of this one (same parameter slices, other
  // communication). Null: this style as it is (it moves no activations, e.g.
  // replicated_with_grad_allreduce). A style that cannot run there throws,
  // naming the module.
  virtual std::shared_ptr<const TensorParallelLayer> sequence_parallel_variant(const Module& module) const {
    return nullptr;
  }
};

}  // namespace tp::nn
