#include "tp/ops/moe_dispatch.h"

#include "tp/core/error.h"

namespace tp::ops {

namespace {

void check_ids(const Tensor& ids, const char* op) {
  TP_CHECK(ids.dim() == 2 && ids.dtype() == DType::I64, "{}: expert ids must be i64 [tokens, top_k], got {} {}", op,
           dtype_name(ids.dtype()), shape_str(ids.shape()));
}

}  // namespace

LocalRoutes local_routes(const Tensor& ids, int64_t experts_per_rank, int64_t rank) {
  check_ids(ids, "local_routes");
  LocalRoutes out{Tensor::empty(ids.shape()), Tensor::empty(ids.shape(), DType::I64)};
  const int64_t* id = ids.data<int64_t>();
  float* keep = out.keep.data<float>();
  int64_t* local = out.ids.data<int64_t>();
  for (int64_t p = 0; p < ids.numel(); ++p) {
    const bool mine = id[p] / experts_per_rank == rank;
    keep[p] = mine ? 1.f : 0.f;
    local[p] = mine ? id[p] % experts_per_rank : experts_per_rank;
  }
  return out;
}

DispatchOrder dispatch_order(const Tensor& ids, int64_t experts_per_rank, int64_t ranks) {
  check_ids(ids, "dispatch_order");
  const int64_t experts = experts_per_rank * ranks, K = ids.size(1), n = ids.numel();
  const int64_t* id = ids.data<int64_t>();
  std::vector<int64_t> start(static_cast<size_t>(experts + 1), 0);
  for (int64_t p = 0; p < n; ++p) {
    TP_CHECK(id[p] >= 0 && id[p] < experts, "expert id {} outside [0, {})", id[p], experts);
    ++start[id[p] + 1];
  }
  for (size_t e = 1; e < start.size(); ++e) start[e] += start[e - 1];
  DispatchOrder out;
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
  return out;
}

}  // namespace tp::ops
