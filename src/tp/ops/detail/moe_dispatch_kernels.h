#pragma once
// The kernels behind ops/moe_dispatch.h, one set per device (ops/dispatch.h).
#include "tp/ops/dispatch.h"
#include "tp/ops/moe_dispatch.h"

namespace tp::ops {

struct MoeDispatchKernels {
  // keep f32 and local_ids i64, both [N, K], of ids (i64 [N, K]) for `rank`'s experts.
  void (*local_routes)(const Tensor& ids, int64_t experts_per_rank, int64_t rank, const Tensor& keep,
                       const Tensor& local_ids);
  // The counting sort of ids (i64 [N, K]) by expert into `order` (empty on entry);
  // an id outside [0, experts_per_rank * ranks) is an error naming it.
  void (*dispatch_order)(const Tensor& ids, int64_t experts_per_rank, int64_t ranks, DispatchOrder& order);
};

KernelTable<MoeDispatchKernels>& moe_dispatch_kernels();

}  // namespace tp::ops
