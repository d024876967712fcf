#include "tp/tensor/accumulate.h"

#include "tp/core/parallel_for.h"

namespace tp {

void add_into(Tensor& dst, const Tensor& src) {
  check_same_shape(dst, src, "gradient accumulation");
  const int64_t n = dst.numel();
  if (dst.dtype() == DType::F32 && src.dtype() == DType::F32) {
    float* d = dst.data<float>();
    const float* s = src.data<float>();
    parallel_region(n > 65536, [&] {
#pragma omp for simd schedule(static)
      for (int64_t i = 0; i < n; ++i) d[i] += s[i];
    });
    return;
  }
  Tensor a = dst.to(DType::F32).clone(), b = src.to(DType::F32);
  float* d = a.data<float>();
  const float* s = b.data<float>();
  for (int64_t i = 0; i < n; ++i) d[i] += s[i];
  dst.copy_from(a);
}

}  // namespace tp
