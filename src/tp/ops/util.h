#pragma once
// Small helpers shared by the op implementations (not part of the public API).
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

// out[i] = f(x[i]) over an f32 tensor, OpenMP-parallel for large inputs.
template <class F>
Tensor map_f32(const Tensor& x, F f) {
  Tensor out = Tensor::empty(x.shape());
  const float* s = x.data<float>();
  float* d = out.data<float>();
  int64_t n = x.numel();
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) d[i] = f(s[i]);
  return out;
}

// out[i] = f(a[i], b[i]) over two f32 tensors of the same numel (shape of a).
template <class F>
Tensor zip_f32(const Tensor& a, const Tensor& b, F f) {
  Tensor out = Tensor::empty(a.shape());
  const float* x = a.data<float>();
  const float* y = b.data<float>();
  float* d = out.data<float>();
  int64_t n = a.numel();
#pragma omp parallel for simd schedule(static) if (n > 65536)
  for (int64_t i = 0; i < n; ++i) d[i] = f(x[i], y[i]);
  return out;
}

inline Tensor mul_same(const Tensor& a, const Tensor& b) {
  return zip_f32(a, b, [](float x, float y) { return x * y; });
}

// A new handle on the same data, so that an op's output never shares autograd
// state with its input (Tensor::to / narrow may return *this).
inline Tensor fresh_handle(const Tensor& t) { return t.reshape(t.shape()); }

}  // namespace tp::ops
