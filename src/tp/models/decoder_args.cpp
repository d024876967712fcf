#include "tp/models/decoder_args.h"

namespace tp {

const DecoderArgs& decoder_args(const nn::ForwardArgs& args, const nn::Module& module) {
  const auto* decoder = dynamic_cast<const DecoderArgs*>(&args);
  TP_CHECK(decoder != nullptr, "{}: called with arguments that are not a decoder's (DecoderArgs)", module.name());
  return *decoder;
}

Tensor decoder_attention(const DecoderArgs& args, int64_t layer, const Tensor& q, const Tensor& k, const Tensor& v,
                         ops::AttentionOptions opt) {
  if (args.cache == nullptr) return ops::attention(q, k, v, opt);
  ops::KVCache& cache = args.cache->layers.at(layer);
  opt.causal = true;
  opt.q_offsets = cache.lengths();
  if (!args.counts.empty()) {
    cache.append(k, v, args.counts);
  } else {
    cache.append(k, v);
  }
  opt.kv_lens = cache.lengths();
  return ops::attention(q, cache.keys(), cache.values(), opt);
}

}  // namespace tp
