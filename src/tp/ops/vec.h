#pragma once
// Vectorized inner loops. Attention's over f32 rows: dot, axpy, an in-place
// softmax, and their blocked forms over the keys of one kv head (rows of q or p
// against n key/value rows `key_stride` floats apart); and the SwiGLU activation,
// which shares softmax's exp; cross-entropy's passes over a row of logits, and greedy decoding's argmax. AVX-512 when
// the CPU has it (chosen once, at run time), AVX2 (or scalar) otherwise.
#include <cstdint>

#include "tp/tensor/dtype.h"

namespace tp::ops::detail {

using DotFn = float (*)(const float* a, const float* b, int64_t n);
using AxpyFn = void (*)(float alpha, const float* x, float* y, int64_t n);  // y += alpha * x
// p[0..n) <- softmax(scale * p[0..n)), in place (n > 0).
using SoftmaxFn = void (*)(float* p, int64_t n, float scale);
// out[r * out_stride + j] = q[r * d ..] . k[j * key_stride ..]   (r < rows, j < n; length d)
using DotsFn = void (*)(const float* q, int64_t rows, const float* k, int64_t key_stride, int64_t n, int64_t d,
                        float* out, int64_t out_stride);
// o[r * d + c] += sum_j p[r * p_stride + j] * v[j * key_stride + c]   (r < rows, j < n, c < d)
using AxpysFn = void (*)(const float* p, int64_t p_stride, int64_t rows, const float* v, int64_t key_stride,
                         int64_t n, int64_t d, float* o);

// The same over a bf16 KV cache (keys/values widened to f32 as they are read).
using DotsBf16Fn = void (*)(const float* q, int64_t rows, const bf16* k, int64_t key_stride, int64_t n, int64_t d,
                            float* out, int64_t out_stride);
using AxpysBf16Fn = void (*)(const float* p, int64_t p_stride, int64_t rows, const bf16* v, int64_t key_stride,
                             int64_t n, int64_t d, float* o);

// out[i] = silu(a[i]) * b[i] = a[i] / (1 + e^-a[i]) * b[i]   (i < n)
using SwigluFn = void (*)(const float* a, const float* b, float* out, int64_t n);
// Its backward in one pass, s = sigmoid(a): da = g b (s + a s (1 - s)), db = g a s (either may be null).
using SwigluBackwardFn = void (*)(const float* a, const float* b, const float* g, float* da, float* db, int64_t n);

// Cross-entropy's passes over a row of logits.
using MaxFn = float (*)(const float* x, int64_t n);                    // max of x[0..n), -inf for n = 0
using ExpSumFn = float (*)(const float* x, int64_t n, float shift);    // sum of e^(x[i] - shift)
// out[i] = scale * e^(x[i] - shift)
using ExpScaleFn = void (*)(const float* x, int64_t n, float shift, float scale, float* out);
// Greedy decoding's pick: the index of the first largest number in x[0..n), NaNs skipped; -1 if x holds none.
using ArgmaxFn = int64_t (*)(const float* x, int64_t n);

struct VecKernels {
  DotFn dot;
  AxpyFn axpy;
  SoftmaxFn softmax;
  DotsFn dots;
  AxpysFn axpys;
  DotsBf16Fn dots_bf16;
  AxpysBf16Fn axpys_bf16;
  SwigluFn swiglu;
  SwigluBackwardFn swiglu_backward;
  MaxFn max;
  ExpSumFn exp_sum;
  ExpScaleFn exp_scale;
  ArgmaxFn argmax;
  const char* isa;  // "avx512" or "avx2"
};

const VecKernels& vec_kernels();
VecKernels vec_kernels_avx2();  // the fallback, exposed so tests can compare both paths

}  // namespace tp::ops::detail
