#include "tp/parallel/sequence.h"

#include "tp/distributed/functional.h"
#include "tp/parallel/style_util.h"

namespace tp::parallel {

namespace {

// Width of a block's input (its first Linear's in_features), for cost estimates.
int64_t input_features(const nn::Module& module) {
  for (nn::Module* m : const_cast<nn::Module&>(module).modules())
    if (auto* linear = dynamic_cast<const nn::Linear*>(m)) return linear->in_features();
  return 0;
}

int64_t norm_features(const nn::Module& module) {
  auto& m = const_cast<nn::Module&>(module);
  std::vector<nn::Parameter*> own = m.own_parameters();
  return own.empty() ? 0 : own[0]->global_shape.back();
}

}  // namespace

std::vector<Tensor> SequenceParallel::transform_inputs_pre_forward(nn::Module& module, std::vector<Tensor> inputs,
                                                                   const dist::DeviceMesh& mesh) const {
  if (options_.sharded_input) return inputs;
  for (Tensor& x : inputs) x = dist::scatter_to_region(x, options_.sequence_dim, mesh.group("tp"));
  return inputs;
}

Tensor SequenceParallel::context_around_forward(nn::Module& module, const std::function<Tensor()>& forward,
                                                const dist::DeviceMesh& mesh) const {
  return with_grad_allreduced_params(module, forward, mesh.group("tp"));
}

Tensor SequenceParallel::transform_output_post_forward(nn::Module& module, Tensor output,
                                                       const dist::DeviceMesh& mesh) const {
  if (!options_.gather_output) return output;
  dist::ProcessGroup& g = mesh.group("tp");
  return options_.sharded_input ? dist::all_gather_to_region(output, options_.sequence_dim, g)
                                : dist::gather_from_region(output, options_.sequence_dim, g);
}

std::vector<nn::CollectiveCost> SequenceParallel::forward_collectives(const nn::Module& module, const nn::TpRank& tp) const {
  if (!options_.gather_output) return {};
  return {{"all_gather", norm_features(module) * 4}};
}

std::shared_ptr<const nn::TensorParallelLayer> SequenceParallel::sequence_parallel_variant(const nn::Module& module) const {
  return variant_with<SequenceParallel>(options_, &Options::sharded_input);
}

std::vector<Tensor> GatherSequenceInput::transform_inputs_pre_forward(nn::Module& module, std::vector<Tensor> inputs,
                                                                      const dist::DeviceMesh& mesh) const {
  if (!active_) return inputs;
  for (Tensor& x : inputs) x = dist::all_gather_to_region(x, 1, mesh.group("tp"));
  return inputs;
}

std::vector<nn::CollectiveCost> GatherSequenceInput::forward_collectives(const nn::Module& module,
                                                                     const nn::TpRank& tp) const {
  if (!active_) return {};
  return {{"all_gather", input_features(module) * 4}};
}

std::shared_ptr<const nn::TensorParallelLayer> GatherSequenceInput::sequence_parallel_variant(
    const nn::Module& module) const {
  return active_ ? nullptr : std::make_shared<GatherSequenceInput>(true);
}

Tensor ScatterSequenceOutput::transform_output_post_forward(nn::Module& module, Tensor output,
                                                            const dist::DeviceMesh& mesh) const {
  return active_ ? dist::scatter_to_region(output, 1, mesh.group("tp")) : output;
}

std::shared_ptr<const nn::TensorParallelLayer> ScatterSequenceOutput::sequence_parallel_variant(
    const nn::Module& module) const {
  return active_ ? nullptr : std::make_shared<ScatterSequenceOutput>(true);
}

void use_sequence_parallel_styles(const ResolvedPlan& plan, nn::Module& root, StyleOverrides& overrides) {
  for (nn::Module* m : root.modules()) {
    auto it = plan.module_style.find(m->name());
    if (it == plan.module_style.end()) continue;
    std::shared_ptr<const nn::TensorParallelLayer> variant = style_for(m->name(), it->second, overrides)
                                                             .sequence_parallel_variant(*m);
    if (variant != nullptr) overrides[m->name()] = std::move(variant);
  }
}

}  // namespace tp::parallel
