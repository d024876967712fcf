#include "tp/ops/bf16_rounding.h"

#include "tp/ops/detail/bf16_rounding_kernels.h"
#include "tp/ops/gemm.h"
#include "tp/ops/util.h"

namespace tp::ops {

namespace {

void round_cpu(const Tensor& src, const Tensor& dst) {
  const auto n = static_cast<size_t>(src.numel());
  if (dst.dtype() == DType::BF16)
    detail::to_bf16_parallel(src.data<float>(), dst.data<bf16>(), n);
  else
    detail::round_to_bf16_parallel(src.data<float>(), dst.data<float>(), n);
}

constexpr Bf16RoundingKernels kCpuBf16RoundingKernels{round_cpu};

}  // namespace

KernelTable<Bf16RoundingKernels>& bf16_rounding_kernels() {
  static KernelTable<Bf16RoundingKernels> table("round_to_bf16", &kCpuBf16RoundingKernels);
  return table;
}

void round_to_bf16(const Tensor& src, const Tensor& dst) {
  check_f32(src, "round_to_bf16", "src");
  TP_CHECK(dst.defined() && (dst.dtype() == DType::BF16 || dst.dtype() == DType::F32) && dst.numel() == src.numel(),
           "round_to_bf16: dst must be bf16 or f32 with {} elements, got {} {}", src.numel(),
           dst.defined() ? dtype_name(dst.dtype()) : "undefined", dst.defined() ? shape_str(dst.shape()) : "");
  bf16_rounding_kernels().on(src, dst).round(src, dst);
}

}  // namespace tp::ops
