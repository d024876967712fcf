#pragma once
// Small helpers shared by the op implementations (not part of the public API).
#include "tp/core/parallel_for.h"
#include "tp/tensor/tensor.h"

namespace tp::ops {

inline void check_floating(const Tensor& t, const char* op) {
  TP_CHECK(t.defined(), "{}: input is undefined", op);
  TP_CHECK(is_floating(t.dtype()), "{}: expected a floating-point tensor, got {} of shape {}", op,
           dtype_name(t.dtype()), shape_str(t.shape()));
}

inline void check_f32(const Tensor& t, const char* op, const char* name) {
  TP_CHECK(t.defined(), "{}: {} is undefined", op, name);
  TP_CHECK(t.dtype() == DType::F32, "{}: {} must be f32, got {} of shape {}", op, name, dtype_name(t.dtype()),
           shape_str(t.shape()));
}

// The generic element loops of the CPU kernels (ops/detail/*_kernels.h): only
// CPU kernel code calls them, never an op, so that every op reaches its
// arithmetic through its family's kernel table.

// out[i] = f(x[i]) over f32 tensors of the same numel, OpenMP-parallel for large inputs.
template <class F>
void map_f32(const Tensor& x, const Tensor& out, F f) {
  const float* s = x.data<float>();
  float* d = out.data<float>();
  int64_t n = x.numel();
  parallel_region(n > 65536, [&] {
#pragma omp for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] = f(s[i]);
  });
}

// out[i] = f(a[i], b[i]) over f32 tensors of the same numel.
template <class F>
void zip_f32(const Tensor& a, const Tensor& b, const Tensor& out, F f) {
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  float* d = out.data<float>();
  int64_t n = a.numel();
  parallel_region(n > 65536, [&] {
#pragma omp for simd schedule(static)
    for (int64_t i = 0; i < n; ++i) d[i] = f(x[i], y[i]);
  });
}

// A new handle on the same data, so that an op's output never shares autograd
// state with its input (Tensor::to / narrow may return *this).
inline Tensor fresh_handle(const Tensor& t) { return t.reshape(t.shape()); }

}  // namespace tp::ops
