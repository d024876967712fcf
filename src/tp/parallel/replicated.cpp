#include "tp/parallel/replicated.h"

#include "tp/distributed/functional.h"
#include "tp/parallel/style_util.h"

namespace tp::parallel {

Tensor ReplicatedWithGradAllreduce::context_around_forward(nn::Module& module, const std::function<Tensor()>& forward,
                                                           const dist::DeviceMesh& mesh) const {
  return with_grad_allreduced_params(module, forward, mesh.group("tp"));
}

Tensor AllReduceOutput::transform_output_post_forward(nn::Module& module, Tensor output,
                                                      const dist::DeviceMesh& mesh) const {
  return dist::reduce_from_region(output, mesh.group("tp"));
}

std::vector<nn::CollectiveCost> AllReduceOutput::forward_collectives(const nn::Module& module,
                                                                 const nn::TpRank& tp) const {
  return {{"all_reduce", output_features(module) * 4}};
}

std::shared_ptr<const nn::TensorParallelLayer> AllReduceOutput::sequence_parallel_variant(const nn::Module& module) const {
  fail("'{}' is all_reduce, which has no sequence-parallel form yet; turn sequence parallelism off for this plan",
       module.name());
}

}  // namespace tp::parallel
