#include "tp/ops/attention.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include "tp/autograd/checkpoint.h"
#include "tp/autograd/tape.h"
#include "tp/core/parallel_for.h"
#include "tp/ops/detail/attention_kernels.h"
#include "tp/ops/gemm.h"
#include "tp/ops/util.h"
#include "tp/ops/vec.h"
#include "tp/tensor/convert.h"
#include "tp/tensor/storage.h"

namespace tp::ops {

namespace detail {

AttentionGeometry check_attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opt) {
  check_f32(q, "attention", "q");
  TP_CHECK((k.dtype() == DType::F32 || k.dtype() == DType::BF16) && v.dtype() == k.dtype(),
           "attention: k and v must both be f32 or both bf16 (a bf16 KV cache), got k {} and v {}",
           dtype_name(k.dtype()), dtype_name(v.dtype()));
  TP_CHECK(q.dim() == 4 && k.dim() == 4, "attention: q {} and k {} must both be [B, T, H, D]", shape_str(q.shape()),
           shape_str(k.shape()));
  TP_CHECK(k.shape() == v.shape(), "attention: k shape {} and v shape {} differ", shape_str(k.shape()),
           shape_str(v.shape()));
  TP_CHECK(q.size(0) == k.size(0) && q.size(3) == k.size(3),
           "attention: q shape {} and k shape {} disagree on batch or head dim", shape_str(q.shape()),
           shape_str(k.shape()));
  int64_t hq = q.size(2), hkv = k.size(2);
  TP_CHECK(hkv > 0 && hq % hkv == 0, "attention: {} query heads (q {}) are not a multiple of {} kv heads (k {})", hq,
           shape_str(q.shape()), hkv, shape_str(k.shape()));
  TP_CHECK(opt.compute_dtype == DType::F32 || opt.compute_dtype == DType::BF16,
           "attention: compute_dtype must be f32 or bf16, got {}", dtype_name(opt.compute_dtype));
  AttentionGeometry g{q.size(0), q.size(1), k.size(1), hq, hkv, q.size(3), hq / hkv, 0.f, opt.causal,
                      opt.compute_dtype, opt.kv_lens, opt.q_offsets};
  g.scale = static_cast<float>(opt.scale != 0 ? opt.scale : 1.0 / std::sqrt(static_cast<double>(std::max<int64_t>(g.d, 1))));
  if (g.kv_lens.empty()) g.kv_lens.assign(static_cast<size_t>(g.b), g.tk);
  if (g.q_offsets.empty()) g.q_offsets.assign(static_cast<size_t>(g.b), g.tk - g.tq);
  TP_CHECK(static_cast<int64_t>(g.kv_lens.size()) == g.b && static_cast<int64_t>(g.q_offsets.size()) == g.b,
           "attention: kv_lens ({}) and q_offsets ({}) need one entry per batch row ({})", g.kv_lens.size(),
           g.q_offsets.size(), g.b);
  for (int64_t s = 0; s < g.b; ++s)
    TP_CHECK(g.kv_lens[s] >= 0 && g.kv_lens[s] <= g.tk, "attention: kv_lens[{}] = {} is outside [0, {}] (k {})", s,
             g.kv_lens[s], g.tk, shape_str(k.shape()));
  TP_CHECK(opt.sliding_window >= 0, "attention: sliding_window must be >= 0 (0: none), got {}", opt.sliding_window);
  TP_CHECK(opt.sliding_window == 0 || opt.causal, "attention: sliding_window {} needs causal attention",
           opt.sliding_window);
  g.window = opt.sliding_window;
  if (opt.sinks.defined()) {
    check_f32(opt.sinks, "attention", "sinks");
    TP_CHECK(opt.sinks.dim() == 1 && opt.sinks.size(0) == hq,
             "attention: sinks {} must be [Hq] with one logit per query head (q {} has {})",
             shape_str(opt.sinks.shape()), shape_str(q.shape()), hq);
    g.sinks = opt.sinks.data<float>();
  }
  return g;
}

float masked_softmax(const AttentionGeometry& g, float* p, int64_t lo, int64_t vis, int64_t n, int64_t h) {
  const auto& vk = vec_kernels();
  for (int64_t j = 0; j < lo; ++j) p[j] = 0.f;
  for (int64_t j = vis; j < n; ++j) p[j] = 0.f;
  const int64_t m = vis - lo;
  if (m <= 0) return 0.f;
  float* row = p + lo;
  if (g.sinks == nullptr) {
    vk.softmax(row, m, g.scale);
    return 1.f;
  }
  for (int64_t j = 0; j < m; ++j) row[j] *= g.scale;
  const float sink = g.sinks[h], top = std::max(vk.max(row, m), sink);
  const float z = vk.exp_sum(row, m, top) + std::exp(sink - top);
  vk.exp_scale(row, m, top, 1.f / z, row);
  return 1.f - std::exp(sink - top) / z;
}

void* thread_scratch(int slot, size_t bytes) {
  thread_local std::shared_ptr<Storage> buffers[kThreadScratchSlots];
  TP_CHECK(slot >= 0 && slot < kThreadScratchSlots, "attention: scratch slot {} out of range", slot);
  std::shared_ptr<Storage>& buffer = buffers[slot];
  if (!buffer || buffer->bytes() < bytes) buffer = Storage::allocate(std::max<size_t>(bytes, 64));
  return buffer->data();
}

}  // namespace detail

namespace {

using Geometry = detail::AttentionGeometry;

// This thread's probabilities, kept between calls: decode calls attention once
// per layer, and a fresh vector each time was a 40 KB malloc and free per call.
float* probability_scratch(size_t n) {
  thread_local std::vector<float> buffer;
  if (buffer.size() < n) buffer.resize(n);
  return buffer.data();
}

// The kernels for cache elements of type T (f32, or a bf16 KV cache).
template <typename T>
auto dots_for(const detail::VecKernels& vk) {
  if constexpr (std::is_same_v<T, float>) return vk.dots; else return vk.dots_bf16;
}
template <typename T>
auto axpys_for(const detail::VecKernels& vk) {
  if constexpr (std::is_same_v<T, float>) return vk.axpys; else return vk.axpys_bf16;
}

// Decode reads the cache in blocks of kKeyBlock keys, and each block's reads
// prefetch the next block: the kernels read one kv head's slice of each key (a
// short run at a long stride), which the hardware prefetchers do not follow. On
// an AMD EPYC, the kernels over qwen3-0.6b's 28 caches of 640 tokens (a probe, as
// bench/ops/bench_attention.cpp lays them out) read them at 6-8 GB/s without
// software prefetches, 21-25 with each key's slice prefetched 16 keys ahead
// inside the kernels, and 28-30 with the whole next block prefetched in memory
// order, a share per kv head, as here.
constexpr int64_t kKeyBlock = 16;

// (Always inlined: GCC 12 counts a prefetch as no side effect, deems a function
// of prefetches alone pure, and drops its calls.)
// Share `part` of `parts` of the cache rows of sequence s's keys [j, j + kKeyBlock) (all kv heads; none past n).
template <typename T>
[[gnu::always_inline]] inline void prefetch_block_share(const Geometry& g, const T* kv, int64_t s, int64_t j, int64_t n,
                                                        int64_t part, int64_t parts) {
  if (j >= n) return;
  const char* first = reinterpret_cast<const char*>(kv + g.kv_index(s, j, 0));
  const int64_t bytes = std::min(kKeyBlock, n - j) * g.hkv * g.d * static_cast<int64_t>(sizeof(T));
  const int64_t share = (bytes / parts + 63) / 64 * 64;
  for (int64_t b = part * share; b < std::min(bytes, (part + 1) * share); b += 64) __builtin_prefetch(first + b);
}

// Kv head kh's slices of keys [j, j + kKeyBlock) of sequence s (none past n).
template <typename T>
[[gnu::always_inline]] inline void prefetch_head_rows(const Geometry& g, const T* kv, int64_t s, int64_t kh, int64_t j,
                                                      int64_t n) {
  for (int64_t jj = j; jj < std::min(j + kKeyBlock, n); ++jj) {
    const char* row = reinterpret_cast<const char*>(kv + g.kv_index(s, jj, kh));
    for (int64_t b = 0; b < g.d * static_cast<int64_t>(sizeof(T)); b += 64) __builtin_prefetch(row + b);
  }
}

// The query heads of one kv group, h = kh * group + r, read the same keys and
// values, so the kernels below walk each key/value row once for the whole group.
// p [group, Tk] holds the probabilities of query row i of every head of the group.
// Keys [lo, n) of the row; p[r * Tk + j] is key lo + j.
template <typename T>
void group_probabilities(const Geometry& g, const float* q, const T* k, int64_t s, int64_t kh, int64_t i, int64_t lo,
                         int64_t n, float* p) {
  const auto& vk = detail::vec_kernels();
  // The group's heads are adjacent rows of q.
  for (int64_t j0 = lo; j0 < n; j0 += kKeyBlock) {
    prefetch_head_rows(g, k, s, kh, j0 + kKeyBlock, n);
    dots_for<T>(vk)(q + g.q_index(s, i, kh * g.group), g.group, k + g.kv_index(s, j0, kh), g.hkv * g.d,
                    std::min(kKeyBlock, n - j0), g.d, p + (j0 - lo), g.tk);
  }
  for (int64_t r = 0; r < g.group; ++r) {
    if (g.plain())
      vk.softmax(p + r * g.tk, n, g.scale);
    else
      detail::masked_softmax(g, p + r * g.tk, 0, n - lo, n - lo, kh * g.group + r);
  }
}

// Prefill: per (sequence, query head, block of query rows) two GEMMs through oneDNN,
//   S [rows, n] = Q_h [rows, D] · K_kh [n, D]^T      (n = keys visible to the block's last row)
//   O_h [rows, D] = P [rows, n] · V_kh [n, D]
// with the causal/length mask and softmax applied to S in between. Q, K, V and O
// are read and written in place through row strides (Hq*D, Hkv*D). T is the GEMMs'
// operand type: float, or bf16 (compute_dtype BF16), when P is rounded for P · V.
constexpr int64_t kQueryBlock = 64;

template <typename T>
void attention_forward_gemm(const Geometry& g, const T* q, const T* k, const T* v, float* out) {
  constexpr DType dt = std::is_same_v<T, float> ? DType::F32 : DType::BF16;
  int64_t blocks = (g.tq + kQueryBlock - 1) / kQueryBlock;
  parallel_region(true, [&] {
    float* p = probability_scratch(static_cast<size_t>(kQueryBlock * g.tk));
    T* p_operand = nullptr;
    if constexpr (std::is_same_v<T, float>)
      p_operand = p;
    else
      p_operand = static_cast<bf16*>(detail::thread_scratch(0, sizeof(bf16) * kQueryBlock * g.tk));
    const auto& vk = detail::vec_kernels();
#pragma omp for collapse(3) schedule(dynamic)
    for (int64_t s = 0; s < g.b; ++s) {
      for (int64_t h = 0; h < g.hq; ++h) {
        for (int64_t blk = 0; blk < blocks; ++blk) {
          int64_t i0 = blk * kQueryBlock, rows = std::min(kQueryBlock, g.tq - i0), kh = h / g.group;
          // The block reads keys [lo, lo + n): lo > 0 only under a sliding window.
          const int64_t lo = std::min(g.first(s, i0), g.visible(s, i0));
          int64_t n = 0;
          for (int64_t i = i0; i < i0 + rows; ++i) n = std::max(n, g.visible(s, i));
          n -= lo;
          float* o = out + g.q_index(s, i0, h);
          if (n <= 0) {
            for (int64_t i = 0; i < rows; ++i) std::memset(o + i * g.hq * g.d, 0, sizeof(float) * g.d);
            continue;
          }
          const T* kb = k + g.kv_index(s, lo, kh);
          const T* vb = v + g.kv_index(s, lo, kh);
          detail::gemm({rows, n, g.d, false, true, dt, dt, g.hq * g.d, g.hkv * g.d, n}, q + g.q_index(s, i0, h),
                       kb, nullptr, p);
          for (int64_t i = 0; i < rows; ++i) {
            float* pr = p + i * n;
            int64_t vis = g.visible(s, i0 + i) - lo;
            if (!g.plain()) {
              detail::masked_softmax(g, pr, std::max<int64_t>(g.first(s, i0 + i) - lo, 0), std::max<int64_t>(vis, 0),
                                     n, h);
              continue;
            }
            if (vis > 0) vk.softmax(pr, vis, g.scale);
            for (int64_t j = vis; j < n; ++j) pr[j] = 0.f;
          }
          if constexpr (!std::is_same_v<T, float>) convert_f32_to_bf16(p, p_operand, static_cast<size_t>(rows * n));
          detail::gemm({rows, g.d, n, false, false, dt, dt, n, g.hkv * g.d, g.hq * g.d}, p_operand, vb, nullptr, o);
        }
      }
    }
  });
}

// Decode-sized work with a row per thread: for each query row, walk the keys in
// memory order (all kv heads of key j are adjacent) a block at a time, so the
// cache is read sequentially once instead of once per kv head at a stride of
// Hkv*D; within a block each kv head's keys are visited for its whole group.
template <typename T>
void attention_forward_rows(const Geometry& g, const float* q, const T* k, const T* v, float* out) {
  parallel_region(true, [&] {
    float* p = probability_scratch(static_cast<size_t>(g.hq * g.tk));
    const auto& vk = detail::vec_kernels();
    const int64_t stride = g.hkv * g.d;
#pragma omp for collapse(2) schedule(static)
    for (int64_t s = 0; s < g.b; ++s) {
      for (int64_t i = 0; i < g.tq; ++i) {
        float* o = out + (s * g.tq + i) * g.hq * g.d;
        std::memset(o, 0, sizeof(float) * g.hq * g.d);
        // Keys [lo, n); p[h * Tk + j] holds key j.
        const int64_t n = g.visible(s, i), lo = std::min(g.first(s, i), n);
        if (n == lo) continue;
        for (int64_t j0 = lo; j0 < n; j0 += kKeyBlock) {
          int64_t nb = std::min(kKeyBlock, n - j0);
          for (int64_t kh = 0; kh < g.hkv; ++kh) {
            prefetch_block_share(g, k, s, j0 + kKeyBlock, n, kh, g.hkv);
            dots_for<T>(vk)(q + g.q_index(s, i, kh * g.group), g.group, k + g.kv_index(s, j0, kh), stride, nb, g.d,
                            p + kh * g.group * g.tk + j0, g.tk);
          }
        }
        for (int64_t h = 0; h < g.hq; ++h) {
          if (g.plain())
            vk.softmax(p + h * g.tk, n, g.scale);
          else
            detail::masked_softmax(g, p + h * g.tk + lo, 0, n - lo, n - lo, h);
        }
        for (int64_t j0 = lo; j0 < n; j0 += kKeyBlock) {
          int64_t nb = std::min(kKeyBlock, n - j0);
          for (int64_t kh = 0; kh < g.hkv; ++kh) {
            prefetch_block_share(g, v, s, j0 + kKeyBlock, n, kh, g.hkv);
            axpys_for<T>(vk)(p + kh * g.group * g.tk + j0, g.tk, g.group, v + g.kv_index(s, j0, kh), stride, nb, g.d,
                             o + kh * g.group * g.d);
          }
        }
      }
    }
  });
}

// Fewer query rows than threads (decode at batch 1 on several threads): split
// the kv heads across threads instead, each walking its keys once per group.
template <typename T>
void attention_forward_heads(const Geometry& g, const float* q, const T* k, const T* v, float* out) {
  parallel_region(true, [&] {
    float* p = probability_scratch(static_cast<size_t>(g.group * g.tk));
    const auto& vk = detail::vec_kernels();
#pragma omp for collapse(3) schedule(static)
    for (int64_t s = 0; s < g.b; ++s) {
      for (int64_t kh = 0; kh < g.hkv; ++kh) {
        for (int64_t i = 0; i < g.tq; ++i) {
          float* o0 = out + ((s * g.tq + i) * g.hq + kh * g.group) * g.d;
          std::memset(o0, 0, sizeof(float) * g.group * g.d);
          const int64_t n = g.visible(s, i), lo = std::min(g.first(s, i), n);
          if (n == lo) continue;
          group_probabilities(g, q, k, s, kh, i, lo, n, p);
          for (int64_t j0 = lo; j0 < n; j0 += kKeyBlock) {
            prefetch_head_rows(g, v, s, kh, j0 + kKeyBlock, n);
            axpys_for<T>(vk)(p + (j0 - lo), g.tk, g.group, v + g.kv_index(s, j0, kh), g.hkv * g.d,
                             std::min(kKeyBlock, n - j0), g.d, o0);
          }
        }
      }
    }
  });
}

// The rows of `src` (f32) that the GEMM path reads, rounded to bf16 into this
// thread's buffer `slot`, laid out as `src`: sequence s's first rows[s] rows of
// `row` elements (a cache's unused tail is not converted).
const bf16* rounded(int slot, const float* src, int64_t seq_len, int64_t row, const std::vector<int64_t>& rows) {
  bf16* dst = static_cast<bf16*>(detail::thread_scratch(slot, sizeof(bf16) * rows.size() * seq_len * row));
  for (size_t s = 0; s < rows.size(); ++s) {
    size_t start = s * seq_len * row;
    detail::to_bf16_parallel(src + start, dst + start, static_cast<size_t>(rows[s] * row));
  }
  return dst;
}

// Many query rows: GEMMs win. Few (decode): row kernels, which create no oneDNN
// primitive per new length; they read a bf16 cache as it is (half the bytes of f32).
void attention_forward_cpu(const Geometry& geometry, const Tensor& q_t, const Tensor& k, const Tensor& v,
                           const Tensor& out_t) {
  Geometry g = geometry;
  if (g.b == 0) return;
  const float* q = q_t.data<float>();
  float* out = out_t.data<float>();
  const bool f32_cache = k.dtype() == DType::F32;
  if (g.tq >= 16 && g.d > 0) {
    if (g.compute == DType::BF16) {
      const bf16* q16 = rounded(1, q, g.tq, g.hq * g.d, std::vector<int64_t>(g.b, g.tq));
      if (!f32_cache) return attention_forward_gemm(g, q16, k.data<bf16>(), v.data<bf16>(), out);
      const bf16* k16 = rounded(2, k.data<float>(), g.tk, g.hkv * g.d, g.kv_lens);
      const bf16* v16 = rounded(3, v.data<float>(), g.tk, g.hkv * g.d, g.kv_lens);
      return attention_forward_gemm(g, q16, k16, v16, out);
    }
    if (f32_cache) return attention_forward_gemm(g, q, k.data<float>(), v.data<float>(), out);
    // A bf16 cache in f32 compute: the keys in use widened to f32 once.
    int64_t used = *std::max_element(g.kv_lens.begin(), g.kv_lens.end());
    Tensor kf = k.narrow(1, 0, used).to(DType::F32), vf = v.narrow(1, 0, used).to(DType::F32);
    g.tk = used;
    return attention_forward_gemm(g, q, kf.data<float>(), vf.data<float>(), out);
  }
  const bool by_rows = g.b * g.tq >= omp_get_max_threads();
  if (f32_cache && by_rows) return attention_forward_rows(g, q, k.data<float>(), v.data<float>(), out);
  if (f32_cache) return attention_forward_heads(g, q, k.data<float>(), v.data<float>(), out);
  if (by_rows) return attention_forward_rows(g, q, k.data<bf16>(), v.data<bf16>(), out);
  attention_forward_heads(g, q, k.data<bf16>(), v.data<bf16>(), out);
}

// Sequence s's new rows go to the cache from its length on (rounded for a bf16 cache).
void append_cpu(const Tensor& k, const Tensor& v, const std::vector<int64_t>& counts,
                const std::vector<int64_t>& lengths, const Tensor& keys, const Tensor& values) {
  const int64_t t = k.size(1), max_len = keys.size(1), row = keys.size(2) * keys.size(3),
                vrow = values.size(2) * values.size(3);
  const size_t es = dtype_size(keys.dtype());
  for (size_t s = 0; s < counts.size(); ++s) {
    const int64_t first = static_cast<int64_t>(s) * t, at = static_cast<int64_t>(s) * max_len + lengths[s];
    convert(k.data<float>() + first * row, DType::F32, static_cast<char*>(keys.raw_data()) + at * row * es,
            keys.dtype(), static_cast<size_t>(counts[s] * row));
    convert(v.data<float>() + first * vrow, DType::F32, static_cast<char*>(values.raw_data()) + at * vrow * es,
            values.dtype(), static_cast<size_t>(counts[s] * vrow));
  }
}

constexpr AttentionKernels kCpuAttentionKernels{attention_forward_cpu, detail::attention_backward_cpu, append_cpu};

}  // namespace

KernelTable<AttentionKernels>& attention_kernels() {
  static KernelTable<AttentionKernels> table("attention", &kCpuAttentionKernels);
  return table;
}

Tensor attention(const Tensor& q, const Tensor& k, const Tensor& v, const AttentionOptions& opt) {
  Geometry g = detail::check_attention(q, k, v, opt);
  Tensor out = autograd::kept_output();  // a selective checkpoint's recompute: the forward's output
  if (!out.defined()) {
    out = Tensor::empty(q.shape());
    attention_kernels().on(q, k, v, opt.sinks).forward(g, q, k, v, out);
  }
  autograd::keep_output(out);
  std::vector<Tensor> inputs{q, k, v};
  if (opt.sinks.defined()) inputs.push_back(opt.sinks);
  if (autograd::needs_grad(inputs)) {
    TP_CHECK(k.dtype() == DType::F32, "attention: gradients need f32 k and v, got {} (a bf16 KV cache is for "
             "inference)", dtype_name(k.dtype()));
    autograd::record("attention", inputs, {out}, [opt, q, k, v](const std::vector<Tensor>& grad) {
      AttentionGrads d = attention_backward(q, k, v, grad[0], opt);
      std::vector<Tensor> grads{d.dq, d.dk, d.dv};
      if (opt.sinks.defined()) grads.push_back(d.dsinks);
      return grads;
    });
  }
  return out;
}

// ---- KV cache

KVCache::KVCache(int64_t batch, int64_t max_len, int64_t kv_heads, int64_t head_dim, DType dtype)
    : KVCache(std::move(for_layers(batch, max_len, head_dim, {{kv_heads, dtype}}).front())) {}

KVCache::KVCache(Tensor keys, Tensor values) : keys_(std::move(keys)), values_(std::move(values)) {
  lengths_.assign(static_cast<size_t>(keys_.size(0)), 0);
}

std::vector<KVCache> KVCache::for_layers(int64_t batch, int64_t max_len, int64_t head_dim,
                                         const std::vector<Layer>& layers) {
  // Each tensor starts on a 64-byte boundary of the one block.
  auto key_dim = [&](const Layer& l) { return l.key_dim > 0 ? l.key_dim : head_dim; };
  auto value_dim = [&](const Layer& l) { return l.value_dim > 0 ? l.value_dim : head_dim; };
  auto aligned_bytes = [&](const Layer& l, int64_t dim) {
    return (static_cast<size_t>(batch * max_len * l.kv_heads * dim) * dtype_size(l.dtype) + 63) / 64 * 64;
  };
  size_t total = 0;
  for (const Layer& l : layers) {
    TP_CHECK(batch >= 0 && max_len >= 0 && l.kv_heads > 0 && key_dim(l) > 0 && value_dim(l) > 0,
             "KVCache: invalid sizes batch {}, max_len {}, kv_heads {}, head_dim {} (keys {}, values {})", batch,
             max_len, l.kv_heads, head_dim, key_dim(l), value_dim(l));
    TP_CHECK(l.dtype == DType::F32 || l.dtype == DType::BF16, "KVCache: dtype must be f32 or bf16, got {}",
             dtype_name(l.dtype));
    total += aligned_bytes(l, key_dim(l)) + aligned_bytes(l, value_dim(l));
  }
  // From the block cache: a block of 2 MiB or more is on huge pages, and the next
  // generation reuses it instead of faulting in fresh pages.
  std::shared_ptr<Storage> block = Storage::allocate(total);
  std::memset(block->data(), 0, total);
  std::vector<KVCache> caches;
  size_t offset = 0;
  for (const Layer& l : layers) {
    Tensor keys = Tensor::wrap(block, offset, {batch, max_len, l.kv_heads, key_dim(l)}, l.dtype);
    offset += aligned_bytes(l, key_dim(l));
    Tensor values = Tensor::wrap(block, offset, {batch, max_len, l.kv_heads, value_dim(l)}, l.dtype);
    offset += aligned_bytes(l, value_dim(l));
    caches.push_back(KVCache(std::move(keys), std::move(values)));
  }
  return caches;
}

void KVCache::append(const Tensor& k, const Tensor& v) {
  append(k, v, std::vector<int64_t>(lengths_.size(), k.defined() && k.dim() == 4 ? k.size(1) : 0));
}

void KVCache::append(const Tensor& k, const Tensor& v, const std::vector<int64_t>& counts) {
  check_f32(k, "KVCache::append", "k");
  check_f32(v, "KVCache::append", "v");
  const Shape& cs = keys_.shape();
  const int64_t dv = values_.size(3);
  TP_CHECK(k.dim() == 4 && v.dim() == 4 && k.size(0) == cs[0] && k.size(2) == cs[2] && k.size(3) == cs[3] &&
               v.size(0) == k.size(0) && v.size(1) == k.size(1) && v.size(2) == k.size(2) && v.size(3) == dv,
           "KVCache::append: k {} and v {} must be [B, T, Hkv, D] matching the cache [{}, max_len {}, {}, {}] (values "
           "D {})",
           shape_str(k.shape()), shape_str(v.shape()), cs[0], cs[1], cs[2], cs[3], dv);
  TP_CHECK(counts.size() == lengths_.size(), "KVCache::append: {} counts for a batch of {}", counts.size(),
           lengths_.size());
  const int64_t t = k.size(1);
  for (size_t s = 0; s < counts.size(); ++s) {
    TP_CHECK(counts[s] >= 0 && counts[s] <= t, "KVCache::append: count {} for sequence {} is outside [0, {}]",
             counts[s], s, t);
    TP_CHECK(lengths_[s] + counts[s] <= cs[1],
             "KVCache::append: sequence {} would grow to {} tokens, past max_len {}", s, lengths_[s] + counts[s],
             cs[1]);
  }
  attention_kernels().on(k, v, keys_, values_).append(k, v, counts, lengths_, keys_, values_);
  for (size_t s = 0; s < counts.size(); ++s) lengths_[s] += counts[s];
}

void KVCache::reset() { std::fill(lengths_.begin(), lengths_.end(), 0); }

void KVCache::reset(int64_t row) {
  TP_CHECK(row >= 0 && row < static_cast<int64_t>(lengths_.size()), "KVCache::reset: row {} outside [0, {})", row,
           lengths_.size());
  lengths_[static_cast<size_t>(row)] = 0;
}

KVCache KVCache::rows(int64_t first, int64_t count) const {
  const int64_t batch = static_cast<int64_t>(lengths_.size());
  TP_CHECK(first >= 0 && count >= 0 && first + count <= batch, "KVCache::rows: rows [{}, {}) outside a batch of {}",
           first, first + count, batch);
  KVCache view(keys_.narrow(0, first, count), values_.narrow(0, first, count));
  std::copy(lengths_.begin() + first, lengths_.begin() + first + count, view.lengths_.begin());
  return view;
}

void KVCache::take_lengths(const KVCache& rows, int64_t first) {
  const int64_t count = static_cast<int64_t>(rows.lengths_.size());
  TP_CHECK(first >= 0 && first + count <= static_cast<int64_t>(lengths_.size()),
           "KVCache::take_lengths: rows [{}, {}) outside a batch of {}", first, first + count, lengths_.size());
  const size_t row_bytes = static_cast<size_t>(keys_.numel() / std::max<int64_t>(keys_.size(0), 1)) *
                           dtype_size(keys_.dtype());
  TP_CHECK(rows.keys_.storage() == keys_.storage() &&
               rows.keys_.storage_offset() == keys_.storage_offset() + static_cast<size_t>(first) * row_bytes,
           "KVCache::take_lengths: the cache given is not rows(first = {}, ...) of this one", first);
  std::copy(rows.lengths_.begin(), rows.lengths_.end(), lengths_.begin() + first);
}

Tensor attention_with_cache(const Tensor& q, KVCache& cache, const Tensor& k_new, const Tensor& v_new, double scale) {
  AttentionOptions opt;
  opt.scale = scale;
  return attention_with_cache(q, cache, k_new, v_new, opt);
}

Tensor attention_with_cache(const Tensor& q, KVCache& cache, const Tensor& k_new, const Tensor& v_new,
                            const AttentionOptions& options) {
  std::vector<int64_t> before = cache.lengths();
  cache.append(k_new, v_new);
  AttentionOptions opt = options;
  opt.causal = true;
  opt.kv_lens = cache.lengths();
  opt.q_offsets = before;
  autograd::NoGradGuard no_grad;
  return attention(q, cache.keys(), cache.values(), opt);
}

}  // namespace tp::ops
