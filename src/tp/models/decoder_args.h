#pragma once
// What one forward of a decoder hands down its layers beside the hidden states:
// the tokens' positions and rope, the KV cache to continue, and where the MoE
// routers' logits go when the forward asks for them. Built by the model's
// run_decoder for that call; the layers pass it on and keep none of it.
#include <functional>
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
  std::vector<PackedSegment> segments;        // a packed forward's (ForwardOptions::segments); empty: none
};

// The DecoderArgs of a forward of ids (batch_of_ids') as `options` ask: the
// positions, cache, counts and segments; the model adds its rope and router logits.
DecoderArgs decoder_call(const Tensor& ids, const ForwardOptions& options);

// `args` as the DecoderArgs a layer of `module` needs, or an error naming the module.
const DecoderArgs& decoder_args(const nn::ForwardArgs& args, const nn::Module& module);

// The part of layer `layer`'s attention that reads its KV cache: `step` gets
// the layer's cache, the counts to append (empty: all) and `inputs` (each
// [B, T, ...]), and returns [B, T, ...]. One call over the whole cache; packed,
// one per segment, on a one-row view of its row with its tokens of each input,
// the outputs joined along the tokens. Needs args.cache.
using CacheStep =
    std::function<Tensor(ops::KVCache& cache, const std::vector<int64_t>& counts, const std::vector<Tensor>& inputs)>;
Tensor with_layer_cache(const DecoderArgs& args, int64_t layer, const std::vector<Tensor>& inputs,
                        const CacheStep& step);

// Layer `layer`'s attention of q [B, T, Hq, D] over k, v [B, T, Hkv, D] at the
// call's positions: with a cache, k and v join that layer's (row b appends
// counts[b] tokens; packed: each segment's tokens join its row) and q attends
// causally over all its row holds; without, causal over k and v. From `opt`:
// scale, sliding_window, sinks. -> [B, T, Hq, D].
Tensor decoder_attention(const DecoderArgs& args, int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v,
                         ops::AttentionOptions opt);

}  // namespace tp
