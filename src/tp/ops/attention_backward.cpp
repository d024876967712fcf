// Attention's backward through GEMMs, flash-attention style. One task per
// (sequence, kv head) takes the query heads of its group together: their rows are
// stacked, row m = i * group + r being query i of head kh * group + r, so that
// every GEMM sees group times the rows, and for each block of query rows
//   S  [M, n] = Q K^T,  P = softmax(scale S) with the mask   (recomputed as the forward did)
//   dP [M, n] = dO V^T
//   dS [M, n] = scale P ∘ (dP − rowsum(P ∘ dP))
//   dV [n, D] += P^T dO,   dK [n, D] += dS^T Q,   dQ [M, D] = dS K
// where n is the number of keys the block's last row sees. Each block holds its
// whole rows of scores, so the row sums need no second pass over the keys and
// nothing is saved from the forward.
//
// The task owns its kv head's dK and dV rows: no two threads write one row, and
// each row sums its blocks in the same order whatever the thread count.
//
// A sliding window only masks more of each block's scores (the block still
// computes them from key 0: windowed training is not the hot path, and the
// blocks keep their prefix structure). A sink is a column of the softmax whose
// value is zero, so dS keeps its form with the sink-scaled P, and
//   dsink_h = sum over rows of -P_sink (rowsum(P ∘ dP)),  P_sink = 1 - rowsum(P),
// summed per (sequence, head) by the task, then over sequences in order.
#include <cstring>
#include <type_traits>

#include "tp/ops/attention.h"
#include "tp/ops/detail/attention_kernels.h"
#include "tp/ops/gemm.h"
#include "tp/ops/util.h"
#include "tp/ops/vec.h"
#include "tp/tensor/convert.h"

namespace tp::ops {

namespace {

using Geometry = detail::AttentionGeometry;

// Stacked rows per block: at 128 the GEMMs over the block's rows (dV, dK) do 256
// flops per element they add into dV/dK, and a block's scores fit in L2.
constexpr int64_t kStackedRows = 128;

// f32 rows into a GEMM operand of type T (float, or bf16 for compute_dtype BF16).
template <typename T>
void store(const float* src, T* dst, int64_t n) {
  if constexpr (std::is_same_v<T, float>)
    std::memcpy(dst, src, sizeof(float) * static_cast<size_t>(n));
  else
    convert_f32_to_bf16(src, dst, static_cast<size_t>(n));
}

// This thread's buffer `slot` of n elements of type E; slots 4.. (the forward's are 0-3).
template <typename E>
E* scratch(int slot, int64_t n) {
  return static_cast<E*>(detail::thread_scratch(4 + slot, sizeof(E) * static_cast<size_t>(n)));
}

// In f32 compute the GEMMs read P and dS where they are computed; in bf16 they
// read rounded copies.
template <typename T>
T* operand(float* f32, int slot, int64_t n) {
  if constexpr (std::is_same_v<T, float>)
    return f32;
  else
    return scratch<bf16>(slot, n);
}

// Rows [from, to) of this task's part of dq (its group of heads) or of dk/dv (its kv head).
void zero_rows(float* base, int64_t from, int64_t to, int64_t stride, int64_t width) {
  for (int64_t i = from; i < to; ++i) std::memset(base + i * stride, 0, sizeof(float) * static_cast<size_t>(width));
}

// dsink [B, Hq]: this task's (sequence, heads of its group) sink gradients, or null.
template <typename T>
void backward_task(const Geometry& g, int64_t s, int64_t kh, const float* q, const float* k, const float* v,
                   const float* dout, float* dq, float* dk, float* dv, float* dsink) {
  constexpr DType dt = std::is_same_v<T, float> ? DType::F32 : DType::BF16;
  const auto& vk = detail::vec_kernels();
  const int64_t d = g.d, group = g.group, kv_stride = g.hkv * d, q_stride = g.hq * d;
  float* dq_task = dq + g.q_index(s, 0, kh * group);
  float* dk_task = dk + g.kv_index(s, 0, kh);
  float* dv_task = dv + g.kv_index(s, 0, kh);
  const int64_t rows_per_block = std::max<int64_t>(1, kStackedRows / group), max_m = rows_per_block * group;
  int64_t n_max = 0;
  for (int64_t i = 0; i < g.tq; ++i) n_max = std::max(n_max, g.visible(s, i));
  zero_rows(dk_task, n_max, g.tk, kv_stride, d);
  zero_rows(dv_task, n_max, g.tk, kv_stride, d);
  if (n_max == 0) return zero_rows(dq_task, 0, g.tq, q_stride, group * d);

  // K and V of this kv head: read in place in f32, rounded once per task in bf16.
  const T* kh_k = nullptr;
  const T* kh_v = nullptr;
  int64_t ld_kv = kv_stride;
  if constexpr (std::is_same_v<T, float>) {
    kh_k = k + g.kv_index(s, 0, kh);
    kh_v = v + g.kv_index(s, 0, kh);
  } else {
    bf16* kc = scratch<bf16>(0, n_max * d);
    bf16* vc = scratch<bf16>(1, n_max * d);
    for (int64_t j = 0; j < n_max; ++j) {
      store(k + g.kv_index(s, j, kh), kc + j * d, d);
      store(v + g.kv_index(s, j, kh), vc + j * d, d);
    }
    kh_k = kc;
    kh_v = vc;
    ld_kv = d;
  }
  T* qs = scratch<T>(2, max_m * d);
  T* dos = scratch<T>(3, max_m * d);
  float* p = scratch<float>(4, max_m * n_max);
  float* ds = scratch<float>(5, max_m * n_max);
  T* p_op = operand<T>(p, 6, max_m * n_max);
  T* ds_op = operand<T>(ds, 7, max_m * n_max);
  float* tmp = scratch<float>(8, std::max(n_max, max_m) * d);
  // dK and dV summed here, contiguous, and stored once: adding into rows Hkv * D
  // apart (4 KiB for qwen3's 8 heads) thrashed L1's sets.
  float* dk_sum = scratch<float>(9, n_max * d);
  float* dv_sum = scratch<float>(10, n_max * d);

  // Last block first: it sees the most keys (n_max, the mask being monotone in i),
  // so its products initialise the sums and the earlier blocks' add to a prefix.
  bool first = true;
  const int64_t blocks = (g.tq + rows_per_block - 1) / rows_per_block;
  for (int64_t blk = blocks - 1; blk >= 0; --blk) {
    const int64_t i0 = blk * rows_per_block, rows = std::min(rows_per_block, g.tq - i0), m = rows * group;
    int64_t n = 0;
    for (int64_t i = i0; i < i0 + rows; ++i) n = std::max(n, g.visible(s, i));
    if (n == 0) {
      zero_rows(dq_task, i0, i0 + rows, q_stride, group * d);
      continue;
    }
    // A query's group of heads is contiguous in q and dout: one row of group * D.
    for (int64_t i = 0; i < rows; ++i) {
      store(q + g.q_index(s, i0 + i, kh * group), qs + i * group * d, group * d);
      store(dout + g.q_index(s, i0 + i, kh * group), dos + i * group * d, group * d);
    }
    detail::gemm({m, n, d, false, true, dt, dt, d, ld_kv, n}, qs, kh_k, nullptr, p);
    detail::gemm({m, n, d, false, true, dt, dt, d, ld_kv, n}, dos, kh_v, nullptr, ds);
    for (int64_t r = 0; r < m; ++r) {
      float* pr = p + r * n;
      float* dsr = ds + r * n;
      const int64_t vis = g.visible(s, i0 + r / group);
      float mass = 1.f;
      if (g.plain()) {
        if (vis > 0) vk.softmax(pr, vis, g.scale);
        for (int64_t j = vis; j < n; ++j) pr[j] = 0.f;
      } else {
        mass = detail::masked_softmax(g, pr, std::min(g.first(s, i0 + r / group), vis), vis, n, kh * group + r % group);
      }
      const float dot = vis > 0 ? vk.dot(pr, dsr, vis) : 0.f;
      if (dsink != nullptr && vis > 0) dsink[s * g.hq + kh * group + r % group] -= (1.f - mass) * dot;
      for (int64_t j = 0; j < n; ++j) dsr[j] = pr[j] * (dsr[j] - dot) * g.scale;
    }
    if constexpr (!std::is_same_v<T, float>) {
      store(p, p_op, m * n);
      store(ds, ds_op, m * n);
    }
    // dV and dK: this block's share of every key row it sees.
    if (first) {
      detail::gemm({n, d, m, true, false, dt, dt, n, d, d}, p_op, dos, nullptr, dv_sum);
      detail::gemm({n, d, m, true, false, dt, dt, n, d, d}, ds_op, qs, nullptr, dk_sum);
      std::memset(dv_sum + n * d, 0, sizeof(float) * static_cast<size_t>((n_max - n) * d));
      std::memset(dk_sum + n * d, 0, sizeof(float) * static_cast<size_t>((n_max - n) * d));
      first = false;
    } else {
      detail::gemm({n, d, m, true, false, dt, dt, n, d, d}, p_op, dos, nullptr, tmp);
      vk.axpy(1.f, tmp, dv_sum, n * d);
      detail::gemm({n, d, m, true, false, dt, dt, n, d, d}, ds_op, qs, nullptr, tmp);
      vk.axpy(1.f, tmp, dk_sum, n * d);
    }
    // dQ: the block's rows are complete here (all their keys are in this block).
    detail::gemm({m, d, n, false, false, dt, dt, n, ld_kv, d}, ds_op, kh_k, nullptr, tmp);
    for (int64_t i = 0; i < rows; ++i)
      std::memcpy(dq_task + (i0 + i) * q_stride, tmp + i * group * d, sizeof(float) * group * d);
  }
  for (int64_t j = 0; j < n_max; ++j) {
    std::memcpy(dk_task + j * kv_stride, dk_sum + j * d, sizeof(float) * d);
    std::memcpy(dv_task + j * kv_stride, dv_sum + j * d, sizeof(float) * d);
  }
}

}  // namespace

void detail::attention_backward_cpu(const Geometry& g, const Tensor& q, const Tensor& k, const Tensor& v,
                                    const Tensor& dout, const Tensor& dq_t, const Tensor& dk_t, const Tensor& dv_t,
                                    const Tensor& dsinks) {
  std::vector<float> dsink_rows;  // [B, Hq]
  if (g.sinks != nullptr) dsink_rows.assign(static_cast<size_t>(g.b * g.hq), 0.f);
  float* dsink = g.sinks != nullptr ? dsink_rows.data() : nullptr;
  const float *qp = q.data<float>(), *kp = k.data<float>(), *vp = v.data<float>(), *dop = dout.data<float>();
  float *dq = dq_t.data<float>(), *dk = dk_t.data<float>(), *dv = dv_t.data<float>();
#pragma omp parallel for collapse(2) schedule(dynamic)
  for (int64_t s = 0; s < g.b; ++s) {
    for (int64_t kh = 0; kh < g.hkv; ++kh) {
      if (g.compute == DType::BF16)
        backward_task<bf16>(g, s, kh, qp, kp, vp, dop, dq, dk, dv, dsink);
      else
        backward_task<float>(g, s, kh, qp, kp, vp, dop, dq, dk, dv, dsink);
    }
  }
  if (dsink != nullptr) {
    float* ds = dsinks.data<float>();
    for (int64_t s = 0; s < g.b; ++s)
      for (int64_t h = 0; h < g.hq; ++h) ds[h] += dsink[s * g.hq + h];
  }
}

AttentionGrads attention_backward(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& dout,
                                  const AttentionOptions& opt) {
  const Geometry g = detail::check_attention(q, k, v, opt);
  TP_CHECK(k.dtype() == DType::F32, "attention: gradients need f32 k and v, got {} (a bf16 KV cache is for "
           "inference)", dtype_name(k.dtype()));
  check_f32(dout, "attention_backward", "dout");
  TP_CHECK(dout.shape() == q.shape(), "attention_backward: dout {} must have q's shape {}", shape_str(dout.shape()),
           shape_str(q.shape()));
  // Every element is written by one task (zeros where no query reads a key).
  AttentionGrads grads{Tensor::empty(q.shape()), Tensor::empty(k.shape()), Tensor::empty(v.shape()), Tensor()};
  if (g.d == 0) return grads;
  if (g.sinks != nullptr) grads.dsinks = Tensor::zeros({g.hq});
  attention_kernels()
      .on(q, k, v, dout, opt.sinks)
      .backward(g, q, k, v, dout, grads.dq, grads.dk, grads.dv, grads.dsinks);
  return grads;
}

}  // namespace tp::ops
