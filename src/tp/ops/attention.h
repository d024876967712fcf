#pragma once
// Causal scaled-dot-product attention with grouped-query heads, and a KV cache.
//
//   q [B, Tq, Hq, D], k/v [B, Tk, Hkv, D]  →  out [B, Tq, Hq, D]
//   Hq % Hkv == 0; query head h reads kv head h / (Hq / Hkv).
//   Query i of sequence b sits at absolute position q_offsets[b] + i and (causal)
//   attends keys j <= that position; only keys j < kv_lens[b] are valid (padding).
//   A query with no valid key outputs zeros.
#include <cstdint>
#include <vector>

#include "tp/tensor/tensor.h"

namespace tp::ops {

struct AttentionOptions {
  double scale = 0;                // 0 → 1/sqrt(D)
  bool causal = true;
  std::vector<int64_t> kv_lens;    // per batch: number of valid keys (empty → all Tk)
  std::vector<int64_t> q_offsets;  // per batch: absolute position of query 0 (empty → Tk - Tq)
};

// Differentiable w.r.t. q, k and v. k and v may be bf16 (a KV cache), without gradients.
Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opt = {});

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
  struct Layer {
    int64_t kv_heads;
    DType dtype;
  };
  static std::vector<KVCache> for_layers(int64_t batch, int64_t max_len, int64_t head_dim,
                                         const std::vector<Layer>& layers);
  // k, v [B, T, Hkv, D]: appends T tokens to every sequence; error when a sequence would pass max_len.
  void append(const Tensor& k, const Tensor& v);
  // As above, but sequence b keeps only its first counts[b] <= T tokens (right-padded prompts).
  void append(const Tensor& k, const Tensor& v, const std::vector<int64_t>& counts);
  Tensor keys() const { return keys_; }      // [B, max_len, Hkv, D]
  Tensor values() const { return values_; }  // [B, max_len, Hkv, D]
  const std::vector<int64_t>& lengths() const { return lengths_; }
  int64_t max_len() const { return keys_.size(1); }
  void reset();

 private:
  KVCache(Tensor keys, Tensor values);
  Tensor keys_, values_;
  std::vector<int64_t> lengths_;
};

// Appends k_new/v_new [B, T, Hkv, D] to the cache, then lets q [B, T, Hq, D] (query i
// at position old_length[b] + i) attend causally over everything cached. No grad.
Tensor attention_with_cache(const Tensor& q, KVCache& cache, const Tensor& k_new, const Tensor& v_new,
                            double scale = 0);

}  // namespace tp::ops
