#include "tp/ops/optimizer_updates.h"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <initializer_list>

#include "tp/core/parallel_for.h"
#include "tp/ops/detail/optimizer_update_kernels.h"
#include "tp/ops/util.h"
#include "tp/tensor/convert.h"

namespace tp::ops {

namespace {

// One AdamW update of n elements; every operation as torch's for-loop AdamW
// does it, in that order (decay, m, v, denominator, step), so the vector and
// scalar forms give the same bits. The vector form streams the four arrays at
// about twice the rate of what the compiler makes of the loop for AVX2.
void adamw_portable(const AdamWScalars& c, float* w, const float* g, float* m, float* v, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i] * c.grad_scale;
    w[i] *= c.keep;
    m[i] = m[i] * c.beta1 + c.one_minus_beta1 * gi;
    v[i] = v[i] * c.beta2 + c.one_minus_beta2 * gi * gi;
    const float denom = std::sqrt(v[i]) / c.bias_correction2_sqrt + c.eps;
    w[i] -= c.step_size * m[i] / denom;
  }
}

__attribute__((target("avx512f"))) void adamw_avx512(const AdamWScalars& c, float* w, const float* g, float* m,
                                                      float* v, int64_t n) {
  const __m512 keep = _mm512_set1_ps(c.keep), b1 = _mm512_set1_ps(c.beta1), ob1 = _mm512_set1_ps(c.one_minus_beta1),
               b2 = _mm512_set1_ps(c.beta2), ob2 = _mm512_set1_ps(c.one_minus_beta2),
               bc2 = _mm512_set1_ps(c.bias_correction2_sqrt), eps = _mm512_set1_ps(c.eps),
               step = _mm512_set1_ps(c.step_size), scale = _mm512_set1_ps(c.grad_scale);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 gi = _mm512_mul_ps(_mm512_loadu_ps(g + i), scale);
    const __m512 wi = _mm512_mul_ps(_mm512_loadu_ps(w + i), keep);
    const __m512 mi = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(m + i), b1), _mm512_mul_ps(ob1, gi));
    const __m512 vi = _mm512_add_ps(_mm512_mul_ps(_mm512_loadu_ps(v + i), b2), _mm512_mul_ps(_mm512_mul_ps(ob2, gi), gi));
    const __m512 denom = _mm512_add_ps(_mm512_div_ps(_mm512_sqrt_ps(vi), bc2), eps);
    _mm512_storeu_ps(w + i, _mm512_sub_ps(wi, _mm512_div_ps(_mm512_mul_ps(step, mi), denom)));
    _mm512_storeu_ps(m + i, mi);
    _mm512_storeu_ps(v + i, vi);
  }
  adamw_portable(c, w + i, g + i, m + i, v + i, n - i);
}

using AdamWKernel = void (*)(const AdamWScalars&, float*, const float*, float*, float*, int64_t);

AdamWKernel adamw_kernel() {
  static const AdamWKernel k = __builtin_cpu_supports("avx512f") ? adamw_avx512 : adamw_portable;
  return k;
}

void sgd_portable(const SgdScalars& c, float* w, const float* g, float* b, int64_t n) {
#pragma omp simd
  for (int64_t i = 0; i < n; ++i) {
    float d = g[i] * c.grad_scale + c.weight_decay * w[i];
    if (b) d = b[i] = c.first ? d : c.momentum * b[i] + d;
    w[i] -= c.rate * d;
  }
}

// Elements per task: the update of one block and its bf16 rounding stay in cache.
constexpr int64_t kBlock = 4096;

// update(at, n) on each block [at, at + n) of w, blocks over threads, then the
// block's new masters rounded into `compute` where defined.
template <class Update>
void by_blocks(const Tensor& w_t, const Tensor& compute, Update update) {
  const float* w = w_t.data<float>();
  const int64_t n = w_t.numel(), blocks = (n + kBlock - 1) / kBlock;
  parallel_for(blocks, blocks > 16, [&](int64_t b) {
    const int64_t at = b * kBlock, len = std::min(kBlock, n - at);
    update(at, len);
    if (!compute.defined()) return;
    if (compute.dtype() == DType::BF16)
      convert_f32_to_bf16(w + at, compute.data<bf16>() + at, static_cast<size_t>(len));
    else
      round_f32_to_bf16(w + at, compute.data<float>() + at, static_cast<size_t>(len));
  });
}

void adamw_cpu(const AdamWScalars& c, const Tensor& w_t, const Tensor& g_t, const Tensor& m_t, const Tensor& v_t,
               const Tensor& compute) {
  float* w = w_t.data<float>();
  const float* g = g_t.data<float>();
  float* m = m_t.data<float>();
  float* v = v_t.data<float>();
  const AdamWKernel kernel = adamw_kernel();
  by_blocks(w_t, compute, [&](int64_t at, int64_t n) { kernel(c, w + at, g + at, m + at, v + at, n); });
}

void sgd_cpu(const SgdScalars& c, const Tensor& w_t, const Tensor& g_t, const Tensor& b_t, const Tensor& compute) {
  float* w = w_t.data<float>();
  const float* g = g_t.data<float>();
  float* b = b_t.defined() ? b_t.data<float>() : nullptr;
  by_blocks(w_t, compute, [&](int64_t at, int64_t n) { sgd_portable(c, w + at, g + at, b ? b + at : nullptr, n); });
}

constexpr OptimizerUpdateKernels kCpuOptimizerUpdateKernels{adamw_cpu, sgd_cpu};

void check_spans(const char* op, std::initializer_list<const Tensor*> spans, const Tensor& compute) {
  const Tensor& w = **spans.begin();
  for (const Tensor* t : spans) {
    if (t != &w && !t->defined()) continue;  // SGD's buffer without momentum
    check_f32(*t, op, "an operand");
    TP_CHECK(t->numel() == w.numel(), "{}: operands of {} and {} elements", op, w.numel(), t->numel());
  }
  TP_CHECK(!compute.defined() || ((compute.dtype() == DType::BF16 || compute.dtype() == DType::F32) &&
                                  compute.numel() == w.numel()),
           "{}: the compute copy must be bf16 or f32 with {} elements", op, w.numel());
}

}  // namespace

KernelTable<OptimizerUpdateKernels>& optimizer_update_kernels() {
  static KernelTable<OptimizerUpdateKernels> table("optimizer_update", &kCpuOptimizerUpdateKernels);
  return table;
}

void adamw_update(const AdamWScalars& c, const Tensor& w, const Tensor& g, const Tensor& m, const Tensor& v,
                  const Tensor& compute) {
  check_spans("adamw_update", {&w, &g, &m, &v}, compute);
  optimizer_update_kernels().on(w, g, m, v, compute).adamw(c, w, g, m, v, compute);
}

void sgd_update(const SgdScalars& c, const Tensor& w, const Tensor& g, const Tensor& b, const Tensor& compute) {
  check_spans("sgd_update", {&w, &g, &b}, compute);
  optimizer_update_kernels().on(w, g, b, compute).sgd(c, w, g, b, compute);
}

}  // namespace tp::ops
