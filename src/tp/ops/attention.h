#pragma once
// Causal scaled-dot-product attention with grouped-query heads, and a KV cache.
//
//   q [B, Tq, Hq, D], k/v [B, Tk, Hkv, D]  →  out [B, Tq, Hq, D]
//   Hq % Hkv == 0; query head h reads kv head h / (Hq / Hkv).
//   Query i of sequence b sits at absolute position q_offsets[b] + i and (causal)
//   attends keys j <= that position; only keys j < kv_lens[b] are valid (padding).
//   A query with no valid key outputs zeros.
//   Sliding window W (Mistral, GPT-OSS): the query at position p sees only keys
//   j in (p - W, p], as Transformers' sliding-window causal mask.
//   Sinks (GPT-OSS): a learned logit per query head that joins every row's softmax
//   denominator and attends to no value:
//     P_j = exp(s_j - m) / (sum_k exp(s_k - m) + exp(sink_h - m)),  m = max(max_k s_k, sink_h)
//   with s = scale * q.k (the sink is not scaled), so a row's probabilities sum to < 1.
//
// Backward: per (sequence, kv head) task, flash-attention style: each block of query
// rows recomputes its scores and probabilities and sends them through GEMMs (see
// attention_backward.cpp); nothing of size Tq x Tk is kept from the forward.
#include <algorithm>
#include <cstdint>
#include <vector>

#include "tp/tensor/tensor.h"

namespace tp::ops {

struct AttentionOptions {
  double scale = 0;                // 0 → 1/sqrt(D)
  bool causal = true;
  std::vector<int64_t> kv_lens;    // per batch: number of valid keys (empty → all Tk)
  std::vector<int64_t> q_offsets;  // per batch: absolute position of query 0 (empty → Tk - Tq)
  // F32, or BF16: the GEMMs' operands (Q, K, V, P; in the backward also dO and dS) are
  // rounded to bf16, as torch.autocast runs attention in bf16; accumulation, softmax
  // and outputs stay f32. Applies where GEMMs run: the forward for Tq >= 16, and the
  // backward. Decode-sized forwards (row kernels) compute in f32 either way.
  DType compute_dtype = DType::F32;
  int64_t sliding_window = 0;      // > 0: keys in (p - sliding_window, p] only; needs causal
  Tensor sinks;                    // undefined, or [Hq] f32 (differentiable): attention sinks
};

// Differentiable w.r.t. q, k and v. k and v may be bf16 (a KV cache), without gradients.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opt = {});

// The gradients of attention(q, k, v, opt) for the output gradient dout (f32, q's
// shape): what the op's recorded backward computes, without the tape. Deterministic:
// each kv head's dk/dv rows are written by one thread, in a fixed order.
struct AttentionGrads {
  Tensor dq, dk, dv;
  Tensor dsinks;  // [Hq] when opt.sinks is defined
};
AttentionGrads attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                                  const AttentionOptions& opt = {});

// Preallocated keys/values [B, max_len, Hkv, D] for one layer, f32 or bf16 (as
// Transformers keeps the cache in the model's dtype; half the bytes a decode step
// reads). append() copies the new tokens (f32, rounded to bf16 for a bf16 cache)
// at each sequence's current length; nothing is allocated per token.
class KVCache {
 public:
  KVCache(int64_t batch, int64_t max_len, int64_t kv_heads, int64_t head_dim, DType dtype = DType::F32);
  // One cache per entry of `layers` ({kv_heads, dtype}), all in one zeroed block.
  // Why: a layer's cache is often under 2 MiB (qwen3-0.6b: 1.3 MB at 640 tokens)
  // and alone would sit on 4 KiB pages; decode attention then missed the TLB every
  // 4 KiB and ran ~2.5x slower than over the huge pages a shared block gets.
  // key_dim / value_dim: 0 is for_layers' head_dim. They differ for a cache that
  // holds something else than per-head keys and values (MLA: the compressed
  // latent as keys, the shared rope key as values, one "head" each).
  struct Layer {
    int64_t kv_heads;
    DType dtype;
    int64_t key_dim = 0;
    int64_t value_dim = 0;
  };
  static std::vector<KVCache> for_layers(int64_t batch, int64_t max_len, int64_t head_dim,
                                         const std::vector<Layer>& layers);
  // k, v [B, T, Hkv, D]: appends T tokens to every sequence; error when a sequence would pass max_len.
  void append(const Tensor& k, const Tensor& v);
  // As above, but sequence b keeps only its first counts[b] <= T tokens (right-padded prompts).
  void append(const Tensor& k, const Tensor& v, const std::vector<int64_t>& counts);
  Tensor keys() const { return keys_; }      // [B, max_len, Hkv, D] (D = key_dim)
  Tensor values() const { return values_; }  // [B, max_len, Hkv, D] (D = value_dim)
  const std::vector<int64_t>& lengths() const { return lengths_; }
  int64_t max_len() const { return keys_.size(1); }
  void reset();
  // Sequence `row` starts over (length 0); the others keep theirs. A server reuses
  // one cache for many requests, one row per sequence slot.
  void reset(int64_t row);

  // Sequences [first, first + count) as a cache of their own: a view of the same
  // memory (rows are contiguous), with a copy of their lengths. A forward on the
  // view fills these rows alone, at the cost of its own batch size (a prompt
  // prefilled without the other slots' padding); take_lengths() then copies the
  // view's lengths back.
  KVCache rows(int64_t first, int64_t count) const;
  void take_lengths(const KVCache& rows, int64_t first);

 private:
  KVCache(Tensor keys, Tensor values);
  Tensor keys_, values_;
  std::vector<int64_t> lengths_;
};

// Appends k_new/v_new [B, T, Hkv, D] to the cache, then lets q [B, T, Hq, D] (query i
// at position old_length[b] + i) attend causally over everything cached. No grad.
// From `opt` only scale, compute_dtype, sliding_window and sinks apply (the
// cache sets the lengths and offsets). A windowed layer's cache keeps every
// token (no ring buffer): the mask, not the cache, drops the old keys.
Tensor attention_with_cache(const Tensor& q, KVCache& cache, const Tensor& k_new, const Tensor& v_new,
                            const AttentionOptions& opt);
Tensor attention_with_cache(const Tensor& q, KVCache& cache, const Tensor& k_new, const Tensor& v_new,
                            double scale = 0);

namespace detail {

// One call's sizes and per-sequence limits, checked; shared by the forward
// (attention.cpp) and the backward (attention_backward.cpp).
struct AttentionGeometry {
  int64_t b, tq, tk, hq, hkv, d, group;
  float scale;
  bool causal;
  DType compute;
  std::vector<int64_t> kv_lens, q_offsets;
  int64_t window = 0;             // sliding window, 0: none
  const float* sinks = nullptr;   // [hq], or null

  // Query i of sequence s reads keys [first(s, i), visible(s, i)).
  int64_t visible(int64_t s, int64_t i) const {
    int64_t n = kv_lens[s];
    if (causal) n = std::min(n, q_offsets[s] + i + 1);
    return std::max<int64_t>(n, 0);
  }
  int64_t first(int64_t s, int64_t i) const {
    return window > 0 ? std::max<int64_t>(q_offsets[s] + i - window + 1, 0) : 0;
  }
  // Neither a window nor sinks: every row is a plain softmax over keys [0, visible).
  bool plain() const { return window == 0 && sinks == nullptr; }
  // Offsets in elements of query row (s, i, h) and of key/value row (s, j, kh).
  int64_t q_index(int64_t s, int64_t i, int64_t h) const { return ((s * tq + i) * hq + h) * d; }
  int64_t kv_index(int64_t s, int64_t j, int64_t kh) const { return ((s * tk + j) * hkv + kh) * d; }
};

AttentionGeometry check_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opt);

// The CPU kernels' helpers (attention.cpp, attention_backward.cpp), on host memory.
// A row of raw scores p[0, n) of query head h becomes its probabilities over
// entries [lo, vis) (0 <= lo <= vis <= n), zeros elsewhere; head h's sink, if
// any, joins the denominator. Returns the probabilities' sum (1 without a sink,
// 0 for an empty range).
float masked_softmax(const AttentionGeometry& g, float* p, int64_t lo, int64_t vis, int64_t n, int64_t h);

// This thread's buffer number `slot` of at least `bytes` (64-byte aligned), kept
// between calls and only grown: page faults cost ~10 us per 4 KiB page here, and
// attention runs once per layer.
constexpr int kThreadScratchSlots = 16;
void* thread_scratch(int slot, size_t bytes);

}  // namespace detail

}  // namespace tp::ops
