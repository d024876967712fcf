#include "tp/parallel/style_util.h"

#include "tp/distributed/functional.h"

namespace tp::parallel {

nn::ParamShard shard_for(const dist::Placement& placement, const Shape& global_shape, const nn::TpRank& tp) {
  nn::ParamShard s;
  s.placement = placement;
  if (std::holds_alternative<dist::Shard>(placement)) {
    s.dim = normalize_dim(std::get<dist::Shard>(placement).dim, static_cast<int64_t>(global_shape.size()));
  } else if (std::holds_alternative<dist::StridedShard>(placement)) {
    s.dim = normalize_dim(std::get<dist::StridedShard>(placement).dim, static_cast<int64_t>(global_shape.size()));
  } else {
    return s;
  }
  s.spans = dist::local_spans(placement, global_shape[s.dim], tp.size, tp.rank);
  return s;
}

std::string local_param_name(const nn::Module& module, const std::string& param_name) {
  const std::string& m = module.name();
  if (!m.empty() && param_name.size() > m.size() && param_name.compare(0, m.size(), m) == 0)
    return param_name.substr(m.size() + 1);
  return param_name;
}

nn::Linear& as_linear(nn::Module& module, const char* style) {
  auto* linear = dynamic_cast<nn::Linear*>(&module);
  TP_CHECK(linear != nullptr, "style '{}' applies to Linear modules, but '{}' is not one", style, module.name());
  return *linear;
}

nn::Embedding& as_embedding(nn::Module& module, const char* style) {
  auto* emb = dynamic_cast<nn::Embedding*>(&module);
  TP_CHECK(emb != nullptr, "style '{}' applies to Embedding modules, but '{}' is not one", style, module.name());
  return *emb;
}

int64_t output_features(const nn::Module& module) {
  if (auto* l = dynamic_cast<const nn::Linear*>(&module)) return l->weight.global_shape[0];
  if (auto* e = dynamic_cast<const nn::Embedding*>(&module)) return e->weight.global_shape[1];
  return 0;
}

Tensor with_grad_allreduced_params(nn::Module& module, const std::function<Tensor()>& forward,
                                   dist::ProcessGroup& group) {
  std::vector<nn::Parameter*> params = module.own_parameters();
  std::vector<Tensor> saved;
  for (nn::Parameter* p : params) {
    saved.push_back(p->data);
    p->data = dist::copy_to_region(p->data, group);
  }
  Tensor out;
  try {
    out = forward();
  } catch (...) {
    for (size_t i = 0; i < params.size(); ++i) params[i]->data = saved[i];
    throw;
  }
  for (size_t i = 0; i < params.size(); ++i) params[i]->data = saved[i];
  return out;
}

}  // namespace tp::parallel
