#pragma once
// Expert parallelism's bookkeeping over routed (token, slot) pairs: which pairs
// a rank's experts serve, and the order that sends each pair to its expert's
// owner. Experts are held in contiguous blocks: rank r owns ids
// [r * experts_per_rank, (r + 1) * experts_per_rank).
#include <cstdint>
#include <vector>

#include "tp/tensor/tensor.h"

namespace tp::ops {

// Masked expert parallelism (every rank sees every token): for ids [N, K] (i64),
// keep [N, K] f32 (1 where the pair's expert is `rank`'s, else 0) and the pair's
// local expert id, or `experts_per_rank` (the sentinel the experts skip) where not.
struct LocalRoutes {
  Tensor keep;
  Tensor ids;
};
LocalRoutes local_routes(const Tensor& ids, int64_t experts_per_rank, int64_t rank);

// Token dispatch: the pairs of ids [N, K] ordered by expert (a stable counting
// sort), and for that order each pair's index p (token p / K, slot p % K), its
// token, its expert's id on the owner, and how many pairs go to each of `ranks`.
// An id outside [0, experts_per_rank * ranks) is an error naming it.
struct DispatchOrder {
  std::vector<int64_t> pairs;        // pair index, in send order
  std::vector<int64_t> rows;         // its token
  std::vector<int64_t> local_ids;    // its expert's id on the owner
  std::vector<int64_t> send_counts;  // pairs per owner rank
};
DispatchOrder dispatch_order(const Tensor& ids, int64_t experts_per_rank, int64_t ranks);

}  // namespace tp::ops
