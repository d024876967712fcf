#include "tp/parallel/moe.h"

#include "tp/distributed/functional.h"
#include "tp/nn/decode_rows.h"
#include "tp/nn/moe.h"
#include "tp/ops/elementwise.h"
#include "tp/ops/moe_dispatch.h"
#include "tp/ops/moe_experts.h"
#include "tp/ops/shape.h"
#include "tp/parallel/style_util.h"

namespace tp::parallel {

namespace {

nn::MoeExperts& as_experts(nn::Module& module, const char* style) {
  auto* experts = dynamic_cast<nn::MoeExperts*>(&module);
  TP_CHECK(experts != nullptr, "style '{}' applies to a MoE experts module (mlp.experts), but '{}' is not one", style,
           module.name());
  return *experts;
}

bool any_param_sharded(nn::Module& module) {
  for (nn::Parameter* p : module.own_parameters())
    if (!p->shard.replicated()) return true;
  return false;
}

// The group whose ranks each hold part of the experts: "ep" when the expert dim
// is sharded, else "tp" (each rank holds a slice of every expert).
dist::ProcessGroup& experts_group(const nn::MoeExperts& experts, const dist::DeviceMesh& mesh, const char* style) {
  return experts.experts_sharded() ? ep_group(mesh, experts, style) : mesh.group("tp");
}

// What ep_dispatch_experts keeps from its input hook to its output hook.
struct DispatchState {
  std::vector<int64_t> rows;          // token (in this rank's chunk) of each sent pair, in send order
  Tensor pair_weights;                // [P, 1] routing weight of each sent pair (differentiable)
  std::vector<int64_t> send_counts;   // pairs sent to each ep rank
  std::vector<int64_t> recv_counts;   // pairs received from each ep rank
  int64_t tokens = 0;                 // all tokens (N)
  ChunkSpan chunk;                    // this tp rank's tokens
};

}  // namespace

dist::ProcessGroup& ep_group(const dist::DeviceMesh& mesh, const nn::Module& module, const char* style) {
  TP_CHECK(mesh.has_dim("ep"), "style '{}' on '{}' needs an expert-parallel mesh dim 'ep' (set ep_size > 1); the mesh "
           "is {}", style, module.name(), mesh.to_string());
  return mesh.group("ep");
}

// ---------------------------------------------------------------- moe_tp_experts

Tensor MoeTpExperts::run_forward(nn::Module& module, std::vector<Tensor> inputs,
                                 const std::function<Tensor(const std::vector<Tensor>&)>& forward,
                                 const dist::DeviceMesh& mesh) const {
  nn::MoeExperts& experts = as_experts(module, "moe_tp_experts");
  TP_CHECK(inputs.size() == 3, "moe_tp_experts: '{}' takes the hidden states, the routing weights and the expert ids",
           module.name());
  dist::ProcessGroup& group = experts_group(experts, mesh, "moe_tp_experts");
  inputs[0] = dist::copy_to_region(inputs[0], group);
  // Each rank's gradient of the routing weights covers its part of every expert:
  // summed here, except under expert parallelism, where ep_router does it.
  // Cut inside each expert, the ranks' partial outputs are summed, so the down
  // bias (GPT-OSS) is left out of them and added after the sum, on every rank
  // (each then has its whole gradient, and the router its share once). Holding
  // whole experts, each rank adds its own experts' biases.
  const bool bias_after_sum =
      experts.down_proj_bias != nullptr && !experts.experts_sharded() && any_param_sharded(module);
  experts.add_down_bias = !bias_after_sum;
  const Tensor weights = inputs[1];  // before the copy below
  if (!experts.experts_sharded()) inputs[1] = dist::copy_to_region(inputs[1], mesh.group("tp"));
  Tensor output = forward(inputs);
  if (!any_param_sharded(module)) return output;
  Tensor sum = dist::reduce_from_region(output, group);
  if (!bias_after_sum) return sum;
  return ops::add(sum, ops::routed_bias(inputs[2], weights, experts.down_proj_bias->data));
}

std::vector<nn::CollectiveCost> MoeTpExperts::forward_collectives(const nn::Module& module, const nn::TpRank& tp) const {
  const auto* experts = dynamic_cast<const nn::MoeExperts*>(&module);
  if (experts == nullptr) return {};
  return {{"all_reduce", experts->hidden_size() * 4}};
}

// ---------------------------------------------------------------- moe_identity_expert

std::vector<Tensor> MoeIdentityExpert::transform_inputs_pre_forward(nn::Module& module, std::vector<Tensor> inputs,
                                                                    const dist::DeviceMesh& mesh) const {
  TP_CHECK(!inputs.empty(), "moe_identity_expert: '{}' got no input", module.name());
  inputs[0] = ops::scale(inputs[0], 1.0 / static_cast<double>(mesh.size("tp")));
  return inputs;
}

// ---------------------------------------------------------------- grouped_gemm

void GroupedGemm::validate_param(const nn::Module& module, const std::string& param_name, const Shape& global_shape,
                                 const nn::TpRank& tp) const {
  TP_CHECK(!global_shape.empty(), "grouped_gemm: '{}' has no expert dimension", param_name);
  TP_CHECK(global_shape[0] % tp.ep_size == 0,
           "Global number of experts must be divisible by number of devices: {} % {} != 0 ('{}' {}, style "
           "grouped_gemm, ep_size {})",
           global_shape[0], tp.ep_size, param_name, shape_str(global_shape), tp.ep_size);
}

nn::ParamShard GroupedGemm::shard_param(const nn::Module& module, const std::string& param_name, const Shape& global_shape,
                                    const nn::TpRank& tp) const {
  if (tp.ep_size == 1) return {};
  return shard_for(dist::Shard{0}, global_shape, nn::TpRank{.size = tp.ep_size, .rank = tp.ep_rank});
}

// ---------------------------------------------------------------- ep_router

void EpRouter::validate_param(const nn::Module& module, const std::string& param_name, const Shape& global_shape,
                              const nn::TpRank& tp) const {
  const auto* router = dynamic_cast<const nn::TopKRouter*>(&module);
  TP_CHECK(router != nullptr,
           "Router module {} is missing `num_experts` and `config.num_experts` (style ep_router applies to a MoE "
           "router such as mlp.gate)",
           module.name());
  TP_CHECK(router->num_experts() % tp.ep_size == 0, "num_experts must be divisible by ep_size: {} % {} != 0 ('{}')",
           router->num_experts(), tp.ep_size, module.name());
}

nn::Routing EpRouter::transform_routing(const nn::TopKRouter& router, nn::Routing r,
                                        const dist::DeviceMesh& mesh) const {
  dist::ProcessGroup& g = ep_group(mesh, router, "ep_router");
  const int64_t n_local = router.num_experts() / g.size(), me = g.rank();
  // Each rank's weight gradient covers only its own experts' slots (#48205): summed here.
  Tensor weights = dist::copy_to_region(r.weights, g);
  // Other ranks' experts: weight 0 and the sentinel id (n_local), which the experts skip.
  const ops::LocalRoutes mine = ops::local_routes(r.ids, n_local, me);
  return {ops::mul(weights, mine.keep), mine.ids};
}

// ---------------------------------------------------------------- ep_dispatch_experts

namespace {

// Sends this rank's chunk of the (token, slot) pairs to the ranks owning their
// experts; `s` records the routes for the way back. -> the experts' inputs.
std::vector<Tensor> dispatch_tokens(const nn::MoeExperts& experts, const std::vector<Tensor>& inputs,
                                    const dist::DeviceMesh& mesh, DispatchState& s) {
  TP_CHECK(inputs.size() == 3,
           "ep_dispatch_experts: '{}' takes the hidden states, the routing weights and the expert ids",
           experts.name());
  dist::ProcessGroup& ep = ep_group(mesh, experts, "ep_dispatch_experts");
  const int64_t n_local = experts.num_local_experts();
  TP_CHECK(n_local * ep.size() == experts.num_experts(),
           "ep_dispatch_experts: '{}' holds {} of {} experts on each of {} ranks; shard its parameters with "
           "grouped_gemm",
           experts.name(), n_local, experts.num_experts(), ep.size());
  Tensor x = inputs[0], weights = inputs[1], ids = inputs[2];
  s.tokens = x.size(0);
  // Every rank of the ep group holds all the tokens (replicated over tp, and every
  // tp group runs the same ones): each dispatches its own chunk, so each (token,
  // slot) pair travels and is computed once (Transformers' ep ranks past tp hold
  // other data; here they would repeat the same pairs).
  s.chunk = chunk_span(s.tokens, ep.size(), ep.rank());
  x = ops::narrow(dist::copy_to_region(x, ep), 0, s.chunk.offset, s.chunk.size);
  weights = ops::narrow(dist::copy_to_region(weights, ep), 0, s.chunk.offset, s.chunk.size);
  const nn::Routing r{weights, ops::narrow(ids, 0, s.chunk.offset, s.chunk.size)};
  const int64_t pairs = r.ids.numel();
  // (token, slot) pairs in order of their expert, so each owner's arrive together.
  ops::DispatchOrder order = ops::dispatch_order(r.ids, n_local, ep.size());
  s.send_counts = std::move(order.send_counts);
  s.rows = std::move(order.rows);
  const std::vector<int64_t>& local_ids = order.local_ids;
  s.pair_weights = ops::gather_rows(ops::reshape(r.weights, {pairs, 1}), order.pairs);
  Tensor received = dist::all_to_all_rows(ops::gather_rows(x, s.rows), s.send_counts, ep, &s.recv_counts);
  Tensor received_ids = ep.all_to_all_v(Tensor::from_ints(local_ids, {pairs, 1}), s.send_counts);
  // The experts run each received pair once, with weight 1: the weights are applied on the way back.
  Tensor unit = Tensor::full({received.size(0), 1}, 1.0);
  return {received, unit, received_ids};
}

// The experts' outputs back along the routes `s` recorded, weighted and summed
// per token, then every rank's chunk put together.
Tensor combine_tokens(const Tensor& output, const nn::MoeExperts& experts, const dist::DeviceMesh& mesh,
                      const DispatchState& s) {
  dist::ProcessGroup& ep = ep_group(mesh, experts, "ep_dispatch_experts");
  Tensor back = dist::all_to_all_rows(output, s.recv_counts, ep);  // in the order the pairs were sent
  Tensor mine = ops::combine_rows(back, s.rows, ops::reshape(s.pair_weights, {-1}), s.chunk.size);
  // This rank's chunk in place among zeros, summed over ep: every rank gets all tokens.
  const int64_t H = output.size(1);
  std::vector<Tensor> pieces;
  if (s.chunk.offset > 0) pieces.push_back(Tensor::zeros({s.chunk.offset, H}));
  pieces.push_back(mine);
  if (s.tokens > s.chunk.offset + s.chunk.size)
    pieces.push_back(Tensor::zeros({s.tokens - s.chunk.offset - s.chunk.size, H}));
  return dist::reduce_from_region(pieces.size() == 1 ? mine : ops::cat(pieces, 0), ep);
}

}  // namespace

Tensor EpDispatchExperts::run_forward(nn::Module& module, std::vector<Tensor> inputs,
                                      const std::function<Tensor(const std::vector<Tensor>&)>& forward,
                                      const dist::DeviceMesh& mesh) const {
  nn::MoeExperts& experts = as_experts(module, "ep_dispatch_experts");
  DispatchState routes;
  const std::vector<Tensor> dispatched = dispatch_tokens(experts, inputs, mesh, routes);
  const nn::DecodeRows unknown({});  // other ranks' tokens: their kinds are not known here
  return combine_tokens(forward(dispatched), experts, mesh, routes);
}

std::vector<nn::CollectiveCost> EpDispatchExperts::forward_collectives(const nn::Module& module, const nn::TpRank& tp) const {
  const auto* experts = dynamic_cast<const nn::MoeExperts*>(&module);
  if (experts == nullptr) return {};
  // Each of this rank's tokens travels top_k times, there and back (the tokens split over ep first),
  // then the chunks are put back together by an all-reduce over ep.
  const int64_t bytes = experts->top_k() * experts->hidden_size() * 4 / tp.ep_size;
  return {{"all_to_all", bytes}, {"all_to_all", bytes}, {"all_reduce", experts->hidden_size() * 4}};
}

}  // namespace tp::parallel
