#pragma once
// The two modules of a mixture-of-experts layer (Transformers v5 names), which
// the MoE styles (tp/parallel/moe.h) act on:
//   mlp.gate     TopKRouter   weight [E, H] (+ e_score_correction_bias [E]): per token, k experts and their weights
//   mlp.experts  MoeExperts   gate_up_proj [E, 2I, H], down_proj [E, H, I]
// GPT-OSS: mlp.router with a bias; experts gate_up_proj [E, H, 2I] (interleaved
// gate/up columns), down_proj [E, I, H], gate_up_proj_bias [E, 2I], down_proj_bias
// [E, H], its clamped SwiGLU (ExpertLayout below; the math in tp/ops/moe_experts.h).
// The router's choice is two tensors, its weights and the expert ids, which the
// experts take as their inputs {hidden [N, H], weights [N, K], ids [N, K]}.
// An id equal to the experts' local count is the expert-parallel sentinel: that
// slot is skipped.
#include <string>
#include <vector>

#include "tp/nn/module.h"
#include "tp/ops/moe_experts.h"

namespace tp::nn {

struct Routing {
  Tensor weights;  // [N, K] f32 (differentiable)
  Tensor ids;      // [N, K] i64
};

class TopKRouter;
// What a parallel style does to a router's choice (ep_router masks the slots of
// other ranks' experts); the router runs it on its choice when its style is one.
// (A router is not called through Module::call, whose output is one tensor: this
// is the one hook of its style it runs.)
class RoutingHook {
 public:
  virtual ~RoutingHook() = default;
  virtual Routing transform_routing(const TopKRouter& router, Routing routing, const dist::DeviceMesh& mesh) const = 0;
};

// How a router turns its logits into (weights, ids): softmax or sigmoid scores,
// grouped choice, renormalisation, scaling (tp/ops/moe_experts.h).
using RouterScoring = ops::RouterScoring;

// A call's arguments that collect the routers' logits [N, E] (f32), one entry
// per router in call order, for the auxiliary load-balancing loss
// (Transformers' output_router_logits). Null: not collected.
struct RouterLogitsArgs : ForwardArgs {
  std::vector<Tensor>* router_logits = nullptr;
};

class TopKRouter : public Module {
 public:
  // score_correction_bias: DeepSeek-V3's e_score_correction_bias [E], added to the
  // scores to choose the experts only (a buffer in Transformers: no gradient).
  // linear_bias: GPT-OSS's router (mlp.router.bias).
  TopKRouter(std::string name, int64_t hidden, int64_t num_experts, RouterScoring scoring,
             bool score_correction_bias = false, bool linear_bias = false);
  Parameter& weight;
  Parameter* bias = nullptr;                     // GPT-OSS: the router's linear has a bias [E]
  Parameter* e_score_correction_bias = nullptr;
  int64_t num_experts() const { return weight.global_shape[0]; }
  const RouterScoring& scoring() const { return scoring_; }

  // x [N, H] -> the choice of each token, after the style's RoutingHook if it has
  // one; the logits added to the call's RouterLogitsArgs when `args` collects them.
  Routing route(const Tensor& x, const ForwardArgs* args = nullptr) const;

 protected:
  // A router's output is two tensors: an error pointing to route().
  Tensor forward(const std::vector<Tensor>& inputs) override;

 private:
  RouterScoring scoring_;
};

// The experts' weight layout and activation (the default: Mixtral's and Qwen3-MoE's).
struct ExpertLayout {
  bool gpt_oss = false;  // in x out weights, interleaved gate/up, biases, clamped SwiGLU
  float swiglu_limit = 7.f;
  float swiglu_alpha = 1.702f;
};

class MoeExperts : public Module {
 public:
  MoeExperts(std::string name, int64_t num_experts, int64_t hidden, int64_t intermediate, int64_t top_k,
             ExpertLayout layout = {});
  Parameter& gate_up_proj;
  Parameter& down_proj;
  Parameter* gate_up_proj_bias = nullptr;
  Parameter* down_proj_bias = nullptr;
  // Experts this rank holds (all of them unless the expert dim is sharded).
  int64_t num_local_experts() const { return local_shape(gate_up_proj)[0]; }
  int64_t num_experts() const { return gate_up_proj.global_shape[0]; }
  int64_t hidden_size() const { return gate_up_proj.global_shape[layout_.gpt_oss ? 1 : 2]; }
  const ExpertLayout& layout() const { return layout_; }
  // Whether forward adds the down bias: under tensor parallelism inside each
  // expert moe_tp_experts adds it after the ranks' partial sums are added up.
  bool add_down_bias = true;
  // Slots per token its router fills (for `tp plan`'s dispatch volume).
  int64_t top_k() const { return top_k_; }
  // The expert dim is sharded (expert parallelism), not replicated or cut inside each expert.
  bool experts_sharded() const { return !gate_up_proj.shard.replicated() && gate_up_proj.shard.dim == 0; }
  // Inference on experts kept packed (GPT-OSS's MXFP4; a quantized checkpoint's per-expert Linears): this rank's
  // experts' gate_up_proj and down_proj as QuantizedLinears in Linear's layout (ops::ExpertOptions), with `up`
  // given gate_up holds the gate rows alone and up the up rows; the two parameters then hold no data. `dtype`:
  // the model's, whose arithmetic a GEMM over them takes (ops::ExpertOptions::packed_compute).
  void set_packed(std::vector<ops::QuantizedLinear> gate_up, std::vector<ops::QuantizedLinear> down,
                  std::vector<ops::QuantizedLinear> up, DType dtype);
  bool packed() const { return !packed_gate_up_.empty(); }
  // Bytes the packed experts hold (0 when not packed).
  size_t packed_bytes() const;

 protected:
  Tensor forward(const std::vector<Tensor>& inputs) override;  // {x [N, H], weights [N, K], ids [N, K]} -> [N, H]

 private:
  int64_t top_k_;
  ExpertLayout layout_;
  std::vector<ops::QuantizedLinear> packed_gate_up_, packed_up_, packed_down_;
  DType packed_compute_ = DType::F32;
};

}  // namespace tp::nn
