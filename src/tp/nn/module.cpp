#include "tp/nn/module.h"

namespace tp::nn {

Shape local_shape(const Parameter& p) {
  Shape s = p.global_shape;
  if (p.shard.replicated()) return s;
  int64_t n = 0;
  for (const ChunkSpan& span : p.shard.spans) n += span.size;
  s[p.shard.dim] = n;
  return s;
}

Tensor Module::call_with_style(std::vector<Tensor> inputs, const TensorParallelLayer* style,
                               const ForwardArgs* args) {
  auto run = [this, args](const std::vector<Tensor>& in) { return args ? forward_with(in, *args) : forward(in); };
  if (style == nullptr) return run(inputs);
  TP_CHECK(mesh_ != nullptr, "{}: a style runs on the module's mesh, and it has none", name_);
  return style->run_forward(*this, std::move(inputs), run, *mesh_);
}

std::vector<Module*> Module::modules() {
  std::vector<Module*> out{this};
  for (auto& c : children_)
    for (Module* m : c->modules()) out.push_back(m);
  return out;
}

std::vector<Parameter*> Module::own_parameters() {
  std::vector<Parameter*> out;
  for (auto& p : params_) out.push_back(p.get());
  return out;
}

std::vector<Parameter*> Module::parameters() {
  std::vector<Parameter*> out;
  for (Module* m : modules())
    for (Parameter* p : m->own_parameters()) out.push_back(p);
  return out;
}

void Module::set_style(const TensorParallelLayer* style, const dist::DeviceMesh* mesh) {
  style_ = style;
  mesh_ = mesh;
}

Parameter& Module::add_parameter(const std::string& local_name, Shape global_shape, ParamInit init) {
  auto p = std::make_unique<Parameter>();
  p->name = child_name(local_name);
  int64_t elements = 1;
  for (int64_t d : global_shape)
    TP_CHECK(d >= 0 && !__builtin_mul_overflow(elements, d, &elements),
             "config sizes overflow: the element count of {} {} does not fit in 64 bits", p->name,
             shape_str(global_shape));
  p->global_shape = std::move(global_shape);
  p->init = init;
  params_.push_back(std::move(p));
  return *params_.back();
}

}  // namespace tp::nn
