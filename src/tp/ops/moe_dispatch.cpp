#include "tp/ops/moe_dispatch.h"

#include "tp/core/error.h"
#include "tp/ops/detail/moe_dispatch_kernels.h"

namespace tp::ops {

namespace {

// ---- CPU kernels

void local_routes_cpu(const Tensor& ids, int64_t experts_per_rank, int64_t rank, const Tensor& keep_t,
                      const Tensor& local_ids) {
  const int64_t* id = ids.data<int64_t>();
  float* keep = keep_t.data<float>();
  int64_t* local = local_ids.data<int64_t>();
  for (int64_t p = 0; p < ids.numel(); ++p) {
    const bool mine = id[p] / experts_per_rank == rank;
    keep[p] = mine ? 1.f : 0.f;
    local[p] = mine ? id[p] % experts_per_rank : experts_per_rank;
  }
}

void dispatch_order_cpu(const Tensor& ids, int64_t experts_per_rank, int64_t ranks, DispatchOrder& out) {
  const int64_t experts = experts_per_rank * ranks, K = ids.size(1), n = ids.numel();
  const int64_t* id = ids.data<int64_t>();
  std::vector<int64_t> start(static_cast<size_t>(experts + 1), 0);
  for (int64_t p = 0; p < n; ++p) {
    TP_CHECK(id[p] >= 0 && id[p] < experts, "expert id {} outside [0, {})", id[p], experts);
    ++start[id[p] + 1];
  }
  for (size_t e = 1; e < start.size(); ++e) start[e] += start[e - 1];
  out.pairs.resize(static_cast<size_t>(n));
  for (int64_t p = 0; p < n; ++p) out.pairs[static_cast<size_t>(start[id[p]]++)] = p;
  out.send_counts.assign(static_cast<size_t>(ranks), 0);
  out.rows.reserve(out.pairs.size());
  out.local_ids.reserve(out.pairs.size());
  for (const int64_t p : out.pairs) {
    ++out.send_counts[static_cast<size_t>(id[p] / experts_per_rank)];
    out.local_ids.push_back(id[p] % experts_per_rank);
    out.rows.push_back(p / K);
  }
}

constexpr MoeDispatchKernels kCpuMoeDispatchKernels{local_routes_cpu, dispatch_order_cpu};

void check_ids(const Tensor& ids, const char* op) {
  TP_CHECK(ids.dim() == 2 && ids.dtype() == DType::I64, "{}: expert ids must be i64 [tokens, top_k], got {} {}", op,
           dtype_name(ids.dtype()), shape_str(ids.shape()));
}

}  // namespace

KernelTable<MoeDispatchKernels>& moe_dispatch_kernels() {
  static KernelTable<MoeDispatchKernels> table("moe_dispatch", &kCpuMoeDispatchKernels);
  return table;
}

LocalRoutes local_routes(const Tensor& ids, int64_t experts_per_rank, int64_t rank) {
  check_ids(ids, "local_routes");
  LocalRoutes out{Tensor::empty(ids.shape()), Tensor::empty(ids.shape(), DType::I64)};
  moe_dispatch_kernels().on(ids).local_routes(ids, experts_per_rank, rank, out.keep, out.ids);
  return out;
}

DispatchOrder dispatch_order(const Tensor& ids, int64_t experts_per_rank, int64_t ranks) {
  check_ids(ids, "dispatch_order");
  DispatchOrder out;
  moe_dispatch_kernels().on(ids).dispatch_order(ids, experts_per_rank, ranks, out);
  return out;
}

}  // namespace tp::ops
