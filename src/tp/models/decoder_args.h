#pragma once
// What one forward of a decoder hands down its layers beside the hidden states:
// the tokens' positions and rope, the KV cache to continue, and where the MoE
// routers' logits go when the forward asks for them. Built by the model's
// run_decoder for that call; the layers pass it on and keep none of it.
#include <vector>

#include "tp/models/causal_lm.h"
#include "tp/nn/moe.h"
#include "tp/ops/rope.h"

namespace tp {

struct DecoderArgs : nn::RouterLogitsArgs {
  Tensor positions;                           // [B, T] i64
  const std::vector<float>* inv_freq = nullptr;  // the model's rope frequencies (Llama family)
  ops::RopeOptions rope;                      // yarn's factor on cos and sin
  KVState* cache = nullptr;                   // null: no cache
  std::vector<int64_t> counts;                // with a cache: tokens row b appends (empty: all)
};

// `args` as the DecoderArgs a layer of `module` needs, or an error naming the module.
const DecoderArgs& decoder_args(const nn::ForwardArgs& args, const nn::Module& module);

// Layer `layer`'s attention of q [B, T, Hq, D] over k, v [B, T, Hkv, D] at the
// call's positions: with a cache, k and v join that layer's (row b appends
// counts[b] tokens) and q attends causally over all it holds; without, causal
// over k and v. From `opt`: scale, sliding_window, sinks. -> [B, T, Hq, D].
Tensor decoder_attention(const DecoderArgs& args, int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v,
                         ops::AttentionOptions opt);

}  // namespace tp
