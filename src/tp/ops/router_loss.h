#pragma once
// The routers' auxiliary load-balancing loss, as Transformers computes it
// (load_balancing_loss_func of Mixtral / Qwen3-MoE; Switch Transformer eq. 4-6).
// The logits of every sparse layer's router in one forward are concatenated
// into M = layers x tokens rows [M, E]; then
//
//   p[m]   = softmax(logits[m])                      (f32, over all E experts)
//   f[e]   = (1/M) sum_m sum_k [topk_k(p[m]) == e]   (fraction of slots routed to e; no gradient)
//   P[e]   = (1/M) sum_m p[m, e]                     (mean router probability of e)
//   loss   = E * sum_e f[e] * P[e]
//
// f sums the top-k one-hots over the slots: Transformers' [K, E] tokens_per_expert
// times router_prob_per_expert, summed. No attention mask: the Trainer's blocks
// have no padding (Transformers' masked form gives the same value then). The
// model adds router_aux_loss_coef x this to each micro-batch's loss when its
// config sets output_router_logits.
#include <vector>

#include "tp/tensor/tensor.h"

namespace tp::ops {

// logits: [N_l, E] f32 per sparse layer (differentiable) -> scalar, differentiable w.r.t. every logit.
Tensor router_load_balancing_loss(const std::vector<Tensor>& logits, int64_t top_k);

}  // namespace tp::ops
