#include "tp/nn/moe.h"

#include "tp/ops/linear.h"
#include "tp/ops/moe_experts.h"
#include "tp/ops/shape.h"

namespace tp::nn {

Tensor pack_routing(const Tensor& weights, const Tensor& ids) {
  TP_CHECK(weights.shape() == ids.shape() && weights.dim() == 2, "pack_routing: weights {} and ids {} must be [N, K]",
           shape_str(weights.shape()), shape_str(ids.shape()));
  return ops::cat({weights, ids.to(DType::F32)}, 1);
}

Routing unpack_routing(const Tensor& routing) {
  TP_CHECK(routing.dim() == 2 && routing.size(1) % 2 == 0 && routing.dtype() == DType::F32,
           "a routing tensor is f32 [tokens, 2 x top_k] (weights | ids), got {} {}", dtype_name(routing.dtype()),
           shape_str(routing.shape()));
  const int64_t K = routing.size(1) / 2;
  Tensor ids = ops::narrow(routing, 1, K, K).to(DType::I64);
  return {ops::narrow(routing, 1, 0, K), ids};
}

TopKRouter::TopKRouter(std::string name, int64_t hidden, int64_t num_experts, RouterScoring scoring,
                       bool score_correction_bias, bool linear_bias)
    : Module(std::move(name)), weight(add_parameter("weight", {num_experts, hidden})), scoring_(scoring) {
  if (linear_bias) bias = &add_parameter("bias", {num_experts});
  if (score_correction_bias) e_score_correction_bias = &add_parameter("e_score_correction_bias", {num_experts});
  TP_CHECK(scoring.top_k >= 1 && scoring.top_k <= num_experts,
           "{}: num_experts_per_tok {} must be between 1 and the number of experts ({})", this->name(),
           scoring.top_k, num_experts);
}

Tensor TopKRouter::route(const Tensor& x, std::vector<Tensor>* logits_out) const {
  // Logits in the model's arithmetic, then the scores in f32 before the top-k (Transformers).
  const Tensor logits = ops::linear(x, weight.data, bias != nullptr ? bias->data : Tensor());
  const Tensor correction =
      e_score_correction_bias == nullptr ? Tensor() : e_score_correction_bias->data.to(DType::F32);
  ops::TopK top = scoring_.top_k_then_softmax ? ops::top_k_softmax(logits, scoring_.top_k)
                                              : ops::route_top_k(logits, scoring_, correction);
  if (logits_out != nullptr) logits_out->push_back(logits);
  return pack_routing(top.weights, top.ids);
}

Tensor TopKRouter::forward(const std::vector<Tensor>& inputs) {
  TP_CHECK(inputs.size() == 1, "{} takes one input, got {}", name(), inputs.size());
  return route(inputs[0], nullptr);
}

Tensor TopKRouter::forward_with(const std::vector<Tensor>& inputs, const ForwardArgs& args) {
  TP_CHECK(inputs.size() == 1, "{} takes one input, got {}", name(), inputs.size());
  const auto* collect = dynamic_cast<const RouterLogitsArgs*>(&args);
  return route(inputs[0], collect != nullptr ? collect->router_logits : nullptr);
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
                            std::vector<ops::QuantizedLinear> up) {
  TP_CHECK(!gate_up.empty() && gate_up.size() == down.size() && (up.empty() || up.size() == gate_up.size()) &&
               static_cast<int64_t>(gate_up.size()) == num_local_experts(),
           "{}: {} packed gate_up_proj ({} up) and {} down_proj for {} local experts", name(), gate_up.size(),
           up.size(), down.size(), num_local_experts());
  packed_gate_up_ = std::move(gate_up);
  packed_up_ = std::move(up);
  packed_down_ = std::move(down);
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
  TP_CHECK(inputs.size() == 2, "{} takes the hidden states and the routing, got {} inputs", name(), inputs.size());
  const Routing r = unpack_routing(inputs[1]);
  ops::ExpertOptions o =
      layout_.gpt_oss ? ops::ExpertOptions::gpt_oss(layout_.swiglu_limit, layout_.swiglu_alpha) : ops::ExpertOptions{};
  if (packed()) {
    o.packed_gate_up = &packed_gate_up_;
    o.packed_up = packed_up_.empty() ? nullptr : &packed_up_;
    o.packed_down = &packed_down_;
  }
  if (!layout_.gpt_oss) return ops::moe_experts(inputs[0], r.ids, r.weights, gate_up_proj.data, down_proj.data, o);
  o.gate_up_bias = gate_up_proj_bias->data;
  o.down_bias = down_proj_bias->data;
  o.add_down_bias = add_down_bias;
  return ops::moe_experts(inputs[0], r.ids, r.weights, gate_up_proj.data, down_proj.data, o);
}

}  // namespace tp::nn
