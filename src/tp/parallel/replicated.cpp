#include "tp/parallel/replicated.h"

#include "tp/dist/functional.h"
#include "tp/parallel/style_util.h"

namespace tp::parallel {

Tensor ReplicatedWithGradAllreduce::context_around_forward(nn::Module& module, const std::function<Tensor()>& forward,
                                                           const dist::DeviceMesh& mesh) const {
  return with_grad_allreduced_params(module, forward, mesh.group("tp"));
}

std::vector<Tensor> SequenceParallel::transform_inputs_pre_forward(nn::Module& module, std::vector<Tensor> inputs,
                                                                   const dist::DeviceMesh& mesh) const {
  for (Tensor& x : inputs) x = dist::scatter_to_region(x, sequence_dim_, mesh.group("tp"));
  return inputs;
}

Tensor SequenceParallel::context_around_forward(nn::Module& module, const std::function<Tensor()>& forward,
                                                const dist::DeviceMesh& mesh) const {
  return with_grad_allreduced_params(module, forward, mesh.group("tp"));
}

Tensor AllReduceOutput::transform_output_post_forward(nn::Module& module, Tensor output,
                                                      const dist::DeviceMesh& mesh) const {
  return dist::reduce_from_region(output, mesh.group("tp"));
}

std::vector<CollectiveCost> AllReduceOutput::forward_collectives(const nn::Module& module,
                                                                 const TpRank& tp) const {
  return {{"all_reduce", output_features(module) * 4}};
}

}  // namespace tp::parallel
