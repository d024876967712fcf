#pragma once
// The kernels behind ops/optimizer_updates.h, one set per device (ops/dispatch.h).
#include "tp/ops/dispatch.h"
#include "tp/ops/optimizer_updates.h"

namespace tp::ops {

struct OptimizerUpdateKernels {
  void (*adamw)(const AdamWScalars& c, const Tensor& w, const Tensor& g, const Tensor& m, const Tensor& v,
                const Tensor& compute);
  void (*sgd)(const SgdScalars& c, const Tensor& w, const Tensor& g, const Tensor& b, const Tensor& compute);
};

KernelTable<OptimizerUpdateKernels>& optimizer_update_kernels();

}  // namespace tp::ops
