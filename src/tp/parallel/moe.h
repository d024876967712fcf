#pragma once
// The mixture-of-experts styles (Transformers' names), on the modules of
// tp/nn/moe.h: mlp.gate (TopKRouter) and mlp.experts (MoeExperts).
//
// Tensor parallelism inside each expert (every rank runs every routed expert on
// every token over its I / tp slice; one all-reduce of the partial sums):
//   packed_colwise on experts.gate_up_proj [E, 2I, H]: StridedShard(1, 2) (colwise.h)
//   rowwise on experts.down_proj [E, H, I]: Shard(-1) (rowwise.h; its output comm is here)
//   moe_tp_experts on experts — fwd: all-reduce of the output when a parameter is sharded;
//     bwd: all-reduce of the hidden states' gradient, and of the routing weights'
//     unless the experts are expert-parallel (ep_router reduces those). Experts
//     with a down bias (GPT-OSS) get it after the sum (routed_bias), not per rank.
// Expert parallelism (mesh dim "ep"):
//   grouped_gemm on the expert parameters: Shard(0), E / ep_size experts per rank.
//   ep_router on the router (masked EP, ep_size = tp_size, every rank sees every
//     token): bwd all-reduce of the weights' gradient (each rank's is partial),
//     then the slots of other ranks' experts get weight 0 and the sentinel id; the
//     rest are remapped to local ids. moe_tp_experts sums the ranks' outputs.
//   ep_dispatch_experts on the experts (token dispatch): each ep rank takes its
//     chunk of the tokens (every rank holds them all: tp replicates them and the
//     tp groups run the same ones), sends every (token, slot) to the rank owning
//     its expert (all-to-all), runs its experts on what it received, sends the
//     results back (all-to-all; bwd: the reverse exchanges), weights and sums
//     them; the chunks are put back together by an all-reduce over ep (bwd: the
//     hidden states' and weights' gradients all-reduced over ep).
//   moe_identity_expert: the input divided by the tp size (an identity expert
//     would otherwise be counted tp times by the sum).
#include "tp/nn/moe.h"
#include "tp/nn/parallel_layer.h"

namespace tp::parallel {

class MoeTpExperts : public nn::TensorParallelLayer {
 public:
  // Its output hook adds the down bias after the sum with the routing its input hook saw: one run_forward.
  Tensor run_forward(nn::Module& module, std::vector<Tensor> inputs,
                     const std::function<Tensor(const std::vector<Tensor>&)>& forward,
                     const dist::DeviceMesh& mesh) const override;
  std::vector<nn::CollectiveCost> forward_collectives(const nn::Module& module, const nn::TpRank& tp) const override;
};

class MoeIdentityExpert : public nn::TensorParallelLayer {
 public:
  std::vector<Tensor> transform_inputs_pre_forward(nn::Module& module, std::vector<Tensor> inputs,
                                                   const dist::DeviceMesh& mesh) const override;
};

class GroupedGemm : public nn::TensorParallelLayer {
 public:
  void validate_param(const nn::Module& module, const std::string& param_name, const Shape& global_shape,
                      const nn::TpRank& tp) const override;
  nn::ParamShard shard_param(const nn::Module& module, const std::string& param_name, const Shape& global_shape,
                         const nn::TpRank& tp) const override;
};

class EpRouter : public nn::TensorParallelLayer, public nn::RoutingHook {
 public:
  void validate_param(const nn::Module& module, const std::string& param_name, const Shape& global_shape,
                      const nn::TpRank& tp) const override;
  nn::Routing transform_routing(const nn::TopKRouter& router, nn::Routing routing,
                                const dist::DeviceMesh& mesh) const override;
};

class EpDispatchExperts : public nn::TensorParallelLayer {
 public:
  // The results go back along the routes the tokens came: dispatch, experts, combine in one run_forward.
  Tensor run_forward(nn::Module& module, std::vector<Tensor> inputs,
                     const std::function<Tensor(const std::vector<Tensor>&)>& forward,
                     const dist::DeviceMesh& mesh) const override;
  std::vector<nn::CollectiveCost> forward_collectives(const nn::Module& module, const nn::TpRank& tp) const override;
};

// The mesh's expert-parallel group ("ep"), or an error naming the style and module.
dist::ProcessGroup& ep_group(const dist::DeviceMesh& mesh, const nn::Module& module, const char* style);

}  // namespace tp::parallel
