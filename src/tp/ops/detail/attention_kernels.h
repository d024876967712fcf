#pragma once
// The kernels behind ops/attention.h, one set per device (ops/dispatch.h).
// q, dout, out and the gradients are f32 [B, T, H, D] as the header lays out;
// k and v are f32, or bf16 in the forward (a KV cache). The geometry `g` was
// checked by the op (detail::check_attention).
#include <vector>

#include "tp/ops/attention.h"
#include "tp/ops/dispatch.h"

namespace tp::ops {

struct AttentionKernels {
  // out = softmax(scale q k^T, masked as g says) v.
  void (*forward)(const detail::AttentionGeometry& g, const Tensor& q, const Tensor& k, const Tensor& v,
                  const Tensor& out);
  // Every element of dq, dk and dv written; dsinks [Hq] (zeroed by the caller,
  // defined when g has sinks) gets each head's sink gradient added.
  void (*backward)(const detail::AttentionGeometry& g, const Tensor& q, const Tensor& k, const Tensor& v,
                   const Tensor& dout, const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dsinks);
  // KVCache::append's copy: sequence s's first counts[s] tokens of k_new / v_new
  // (f32 [B, T, Hkv, D]) into keys / values (the cache, f32 or bf16: rounded)
  // from position lengths[s] on.
  void (*append)(const Tensor& k_new, const Tensor& v_new, const std::vector<int64_t>& counts,
                 const std::vector<int64_t>& lengths, const Tensor& keys, const Tensor& values);
};

KernelTable<AttentionKernels>& attention_kernels();

namespace detail {
// The CPU backward, in attention_backward.cpp (the table is filled in attention.cpp).
void attention_backward_cpu(const AttentionGeometry& g, const Tensor& q, const Tensor& k, const Tensor& v,
                            const Tensor& dout, const Tensor& dq, const Tensor& dk, const Tensor& dv,
                            const Tensor& dsinks);
}  // namespace detail

}  // namespace tp::ops
