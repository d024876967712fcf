#include "tp/parallel/apply.h"

#include "tp/parallel/registry.h"

namespace tp::parallel {

const nn::TensorParallelLayer& style_for(const std::string& module_name, const std::string& style_name,
                                     const StyleOverrides& overrides) {
  if (auto it = overrides.find(module_name); it != overrides.end()) return *it->second;
  return get_style(style_name);
}

void apply_plan(nn::Module& root, const ResolvedPlan& plan, const nn::TpRank& tp, const dist::DeviceMesh* mesh,
                const StyleOverrides& overrides) {
  for (nn::Module* m : root.modules()) {
    for (nn::Parameter* p : m->own_parameters()) {
      p->shard = {};
      auto it = plan.param_style.find(p->name);
      if (it == plan.param_style.end()) continue;
      const nn::TensorParallelLayer& style = style_for(m->name(), it->second, overrides);
      style.validate_param(*m, p->name, p->global_shape, tp);
      p->shard = style.shard_param(*m, p->name, p->global_shape, tp);
    }
    auto it = plan.module_style.find(m->name());
    if (it == plan.module_style.end()) continue;
    const nn::TensorParallelLayer& style = style_for(m->name(), it->second, overrides);
    style.install_forward(*m, tp);
    if (mesh != nullptr) m->set_style(&style, mesh);
  }
}

}  // namespace tp::parallel
