#pragma once
// Dot product and axpy over f32 rows, the inner loops of attention. AVX-512 when
// the CPU has it (chosen once, at run time), AVX2 otherwise.
#include <cstdint>

namespace tp::ops::detail {

using DotFn = float (*)(const float* a, const float* b, int64_t n);
using AxpyFn = void (*)(float alpha, const float* x, float* y, int64_t n);  // y += alpha * x

struct VecKernels {
  DotFn dot;
  AxpyFn axpy;
  const char* isa;  // "avx512" or "avx2"
};

const VecKernels& vec_kernels();
VecKernels vec_kernels_avx2();  // the fallback, exposed so tests can compare both paths

}  // namespace tp::ops::detail
