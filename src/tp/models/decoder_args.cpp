#include "tp/models/decoder_args.h"

#include "tp/ops/shape.h"

namespace tp {

const DecoderArgs& decoder_args(const nn::ForwardArgs& args, const nn::Module& module) {
  const auto* decoder = dynamic_cast<const DecoderArgs*>(&args);
  TP_CHECK(decoder != nullptr, "{}: called with arguments that are not a decoder's (DecoderArgs)", module.name());
  return *decoder;
}

DecoderArgs decoder_call(const Tensor& ids, const ForwardOptions& options) {
  DecoderArgs args;
  args.positions = token_positions(ids.size(0), ids.size(1), options);
  args.cache = options.cache;
  args.counts = options.counts;
  args.segments = options.segments;
  return args;
}

Tensor with_layer_cache(const DecoderArgs& args, int64_t layer, const std::vector<Tensor>& inputs,
                        const CacheStep& step) {
  ops::KVCache& cache = args.cache->layers.at(static_cast<size_t>(layer));
  if (args.segments.empty()) return step(cache, args.counts, inputs);
  std::vector<Tensor> outputs;
  int64_t first = 0;
  for (const PackedSegment& s : args.segments) {
    ops::KVCache row = cache.rows(s.row, 1);
    std::vector<Tensor> part;
    for (const Tensor& x : inputs) part.push_back(ops::narrow(x, 1, first, s.tokens));
    outputs.push_back(step(row, {}, part));
    cache.take_lengths(row, s.row);
    first += s.tokens;
  }
  return outputs.size() == 1 ? outputs[0] : ops::cat(outputs, 1);
}

Tensor decoder_attention(const DecoderArgs& args, int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v,
                         ops::AttentionOptions opt) {
  if (args.cache == nullptr) return ops::attention(q, k, v, opt);
  opt.causal = true;
  return with_layer_cache(args, layer, {q, k, v},
                          [&opt](ops::KVCache& cache, const std::vector<int64_t>& counts, const std::vector<Tensor>& x) {
                            ops::AttentionOptions o = opt;
                            o.q_offsets = cache.lengths();
                            if (counts.empty()) {
                              cache.append(x[1], x[2]);
                            } else {
                              cache.append(x[1], x[2], counts);
                            }
                            o.kv_lens = cache.lengths();
                            return ops::attention(x[0], cache.keys(), cache.values(), o);
                          });
}

}  // namespace tp
