#include "tp/models/layout.h"

#include "tp/core/error.h"
#include "tp/models/auto.h"
#include "tp/nn/moe.h"

namespace tp {

namespace {

int64_t checked_add(int64_t a, int64_t b, const std::string& what) {
  int64_t r = 0;
  TP_CHECK(!__builtin_add_overflow(a, b, &r), "config sizes overflow: {} does not fit in 64 bits", what);
  return r;
}

int64_t checked_mul(int64_t a, int64_t b, const std::string& what) {
  int64_t r = 0;
  TP_CHECK(!__builtin_mul_overflow(a, b, &r), "config sizes overflow: {} does not fit in 64 bits", what);
  return r;
}

int64_t count(const std::vector<ParamSpec>& specs) {
  int64_t n = 0;
  for (const ParamSpec& p : specs) n = checked_add(n, numel(p.shape), "the parameter count");
  return n;
}

bool in_layers(const std::string& name) { return name.starts_with("model.layers."); }

// "model.layers.N.mlp.<rest>" -> "model.layers.N.<block>.<rest>".
std::string in_block(const std::string& name, const HubNaming& naming) {
  const std::string layer = layer_prefix(name);
  const std::string tail = name.substr(layer.size());
  if (layer.empty() || !tail.starts_with("mlp.")) return name;
  return layer + naming.block + tail.substr(3);
}

// The Hub's per-expert tensors of a tree's fused experts, expert by expert.
void add_per_expert(const nn::MoeExperts& experts, const HubNaming& naming, std::vector<ParamSpec>& out) {
  const Shape& gate_up = experts.gate_up_proj.global_shape;  // [E, 2I, H]
  const Shape& down = experts.down_proj.global_shape;        // [E, H, I]
  const std::string layer = layer_prefix(experts.name());
  for (int64_t e = 0; e < gate_up[0]; ++e) {
    out.push_back({expert_key(layer, naming, e, naming.gate), {gate_up[1] / 2, gate_up[2]}, nn::ParamInit::Normal});
    out.push_back({expert_key(layer, naming, e, naming.up), {gate_up[1] / 2, gate_up[2]}, nn::ParamInit::Normal});
    out.push_back({expert_key(layer, naming, e, naming.down), {down[1], down[2]}, nn::ParamInit::Normal});
  }
}

// `config` with its first decoder layer only (a layer_types list cut to match).
ModelConfig first_layer_only(const ModelConfig& config) {
  nlohmann::json raw = config.raw;
  raw["num_hidden_layers"] = 1;
  if (auto it = raw.find("layer_types"); it != raw.end() && it->is_array() && !it->empty())
    *it = nlohmann::json::array({(*it)[0]});
  return ModelConfig::from_json(raw, config.source);
}

}  // namespace

bool has_known_layout(const std::string& model_type) {
  for (const std::string& t : AutoModelForCausalLM::supported_model_types())
    if (t == model_type) return true;
  return false;
}

std::vector<ParamSpec> checkpoint_layout(CausalLM& model) {
  const CheckpointNames names = model.checkpoint_names();
  const std::map<std::string, std::string> tied = model.tied_parameters();
  std::vector<ParamSpec> out;
  for (nn::Module* m : model.modules()) {
    if (const auto* experts = dynamic_cast<const nn::MoeExperts*>(m); experts && names.experts) {
      add_per_expert(*experts, *names.experts, out);
      continue;
    }
    const bool router = names.experts && dynamic_cast<const nn::TopKRouter*>(m) != nullptr;
    for (const nn::Parameter* p : m->own_parameters()) {
      if (tied.contains(p->name)) continue;
      nn::ParamInit init = p->init;
      if (names.random_biases && init == nn::ParamInit::Zeros) init = nn::ParamInit::Normal;
      out.push_back({router ? in_block(p->name, *names.experts) : p->name, p->global_shape, init});
    }
  }
  count(out);  // the parameter count fits in 64 bits
  return out;
}

std::vector<ParamSpec> checkpoint_layout(const ModelConfig& config) {
  std::unique_ptr<CausalLM> tree = AutoModelForCausalLM::from_config(config);
  return checkpoint_layout(*tree);
}

LayoutCounts layout_counts(const ModelConfig& config) {
  LayoutCounts r;
  for (const ParamSpec& p : checkpoint_layout(config)) {
    if (in_layers(p.name)) {
      r.in_layers = checked_add(r.in_layers, numel(p.shape), "the parameter count");
      ++r.layer_tensors;
    } else {
      r.outside_layers = checked_add(r.outside_layers, numel(p.shape), "the parameter count");
    }
  }
  r.total = checked_add(r.outside_layers, r.in_layers, "the parameter count");
  return r;
}

int64_t estimated_parameter_count(const ModelConfig& config) {
  int64_t outside = 0, layer = 0;
  for (const ParamSpec& p : checkpoint_layout(first_layer_only(config)))
    (in_layers(p.name) ? layer : outside) =
        checked_add(in_layers(p.name) ? layer : outside, numel(p.shape), "the parameter count");
  return checked_add(outside, checked_mul(layer, config.num_hidden_layers, "the parameter count"),
                     "the parameter count");
}

}  // namespace tp
