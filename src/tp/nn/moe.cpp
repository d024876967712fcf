#include "tp/nn/moe.h"

#include "tp/nn/decode_rows.h"
#include "tp/ops/linear.h"
#include "tp/ops/moe_experts.h"

namespace tp::nn {

TopKRouter::TopKRouter(std::string name, int64_t hidden, int64_t num_experts, RouterScoring scoring,
                       bool score_correction_bias, bool linear_bias)
    : Module(std::move(name)), weight(add_parameter("weight", {num_experts, hidden})), scoring_(scoring) {
  if (linear_bias) bias = &add_parameter("bias", {num_experts}, ParamInit::Zeros);
  if (score_correction_bias) e_score_correction_bias = &add_parameter("e_score_correction_bias", {num_experts});
  TP_CHECK(scoring.top_k >= 1 && scoring.top_k <= num_experts,
           "{}: num_experts_per_tok {} must be between 1 and the number of experts ({})", this->name(),
           scoring.top_k, num_experts);
}

Routing TopKRouter::route(const Tensor& x, const ForwardArgs* args) const {
  // Logits in the model's arithmetic, then the scores in f32 before the top-k (Transformers).
  const Tensor logits = ops::linear(x, weight.data, bias != nullptr ? bias->data : Tensor());
  const Tensor correction =
      e_score_correction_bias == nullptr ? Tensor() : e_score_correction_bias->data.to(DType::F32);
  ops::TopK top = scoring_.top_k_then_softmax ? ops::top_k_softmax(logits, scoring_.top_k)
                                              : ops::route_top_k(logits, scoring_, correction);
  if (const auto* collect = dynamic_cast<const RouterLogitsArgs*>(args); collect && collect->router_logits)
    collect->router_logits->push_back(logits);
  Routing routing{top.weights, top.ids};
  if (const auto* hook = dynamic_cast<const RoutingHook*>(style()))
    routing = hook->transform_routing(*this, std::move(routing), *mesh());
  return routing;
}

Tensor TopKRouter::forward(const std::vector<Tensor>& inputs) {
  fail("{}: a router's choice is its weights and expert ids (two tensors); call route()", name());
}

MoeExperts::MoeExperts(std::string name, int64_t num_experts, int64_t hidden, int64_t intermediate, int64_t top_k,
                       ExpertLayout layout)
    : Module(std::move(name)),
      gate_up_proj(add_parameter("gate_up_proj", layout.gpt_oss ? Shape{num_experts, hidden, 2 * intermediate}
                                                                 : Shape{num_experts, 2 * intermediate, hidden})),
      down_proj(add_parameter("down_proj", layout.gpt_oss ? Shape{num_experts, intermediate, hidden}
                                                           : Shape{num_experts, hidden, intermediate})),
      top_k_(top_k),
      layout_(layout) {
  if (layout.gpt_oss) {  // checkpoint order: gate_up_proj, gate_up_proj_bias, down_proj, down_proj_bias
    gate_up_proj_bias = &add_parameter("gate_up_proj_bias", {num_experts, 2 * intermediate});
    down_proj_bias = &add_parameter("down_proj_bias", {num_experts, hidden});
  }
}

void MoeExperts::set_packed(std::vector<ops::QuantizedLinear> gate_up, std::vector<ops::QuantizedLinear> down,
                            std::vector<ops::QuantizedLinear> up, DType dtype) {
  TP_CHECK(!gate_up.empty() && gate_up.size() == down.size() && (up.empty() || up.size() == gate_up.size()) &&
               static_cast<int64_t>(gate_up.size()) == num_local_experts(),
           "{}: {} packed gate_up_proj ({} up) and {} down_proj for {} local experts", name(), gate_up.size(),
           up.size(), down.size(), num_local_experts());
  packed_gate_up_ = std::move(gate_up);
  packed_up_ = std::move(up);
  packed_down_ = std::move(down);
  packed_compute_ = dtype == DType::BF16 ? DType::BF16 : DType::F32;
  gate_up_proj.data = Tensor();
  down_proj.data = Tensor();
}

size_t MoeExperts::packed_bytes() const {
  size_t bytes = 0;
  for (const auto* v : {&packed_gate_up_, &packed_up_, &packed_down_})
    for (const ops::QuantizedLinear& q : *v) bytes += q.nbytes();
  return bytes;
}

Tensor MoeExperts::forward(const std::vector<Tensor>& inputs) {
  TP_CHECK(inputs.size() == 3, "{} takes the hidden states, the routing weights and the expert ids, got {} inputs",
           name(), inputs.size());
  const Routing r{inputs[1], inputs[2]};
  ops::ExpertOptions o =
      layout_.gpt_oss ? ops::ExpertOptions::gpt_oss(layout_.swiglu_limit, layout_.swiglu_alpha) : ops::ExpertOptions{};
  if (packed()) {
    o.packed_gate_up = &packed_gate_up_;
    o.packed_up = packed_up_.empty() ? nullptr : &packed_up_;
    o.packed_down = &packed_down_;
    o.decode_tokens = DecodeRows::for_rows(inputs[0].size(0));
    o.packed_compute = packed_compute_;
  }
  if (!layout_.gpt_oss) return ops::moe_experts(inputs[0], r.ids, r.weights, gate_up_proj.data, down_proj.data, o);
  o.gate_up_bias = gate_up_proj_bias->data;
  o.down_bias = down_proj_bias->data;
  o.add_down_bias = add_down_bias;
  return ops::moe_experts(inputs[0], r.ids, r.weights, gate_up_proj.data, down_proj.data, o);
}

}  // namespace tp::nn
