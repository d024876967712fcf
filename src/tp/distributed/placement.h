#pragma once
// Placements: how a tensor's logical (global) value is laid out over one mesh dim.
//   Shard(d)            rank i holds chunk i of dim d (torch.chunk rule; d may be negative)
//   StridedShard(d, f)  dim d is cut into f equal groups (packed weights such as
//                       [q; k; v] or [gate; up]); rank i holds chunk i of each group,
//                       concatenated in group order
//   Replicate           every rank holds the whole tensor
//   Partial(op)         the value is op over the ranks' local tensors
// Values with ==, printed "S(0)", "SS(0,2)", "R", "P(sum)".
#include <optional>
#include <string>
#include <variant>
#include <vector>

#include "tp/distributed/process_group.h"
#include "tp/tensor/tensor.h"

namespace tp::dist {

class DeviceMesh;

struct Shard {
  int64_t dim;
  bool operator==(const Shard&) const = default;
};
struct StridedShard {
  int64_t dim;
  int64_t split_factor;
  bool operator==(const StridedShard&) const = default;
};
struct Replicate {
  bool operator==(const Replicate&) const = default;
};
struct Partial {
  ReduceOp op = ReduceOp::Sum;
  bool operator==(const Partial&) const = default;
};
using Placement = std::variant<Shard, StridedShard, Replicate, Partial>;

std::string to_string(const Placement& p);
std::string to_string(const std::vector<Placement>& placements);  // "[S(0), R]"

bool is_replicate(const Placement& p);
bool is_partial(const Placement& p);
// The tensor dim a Shard or StridedShard splits (normalized against `ndim`); nullopt otherwise.
std::optional<int64_t> shard_dim(const Placement& p, int64_t ndim);
// The same placement with its dim normalized against `ndim` (errors name the placement).
Placement normalize(const Placement& p, int64_t ndim);

// Where piece `index` of `parts` lies along a dim of size n: one span for Shard
// (tp::chunk_span), split_factor spans for StridedShard (each group of n/f is
// chunk_span'ed), the whole dim for Replicate and Partial.
std::vector<ChunkSpan> local_spans(const Placement& p, int64_t n, int64_t parts, int64_t index);

// This rank's piece of `full` for one placement over `parts` ranks (a copy).
// Partial keeps the value on index 0 for sum and everywhere for avg and max.
Tensor local_piece(const Tensor& full, const Placement& p, int64_t parts, int64_t index);
// The inverse for Shard/StridedShard: places every rank's piece (pieces[i] from
// index i) back into one tensor of size n along the dim.
Tensor assemble_pieces(const std::vector<Tensor>& pieces, const Placement& p, int64_t n);

// The shape this rank holds for a global shape (mesh dims applied in order, each
// splitting what the previous ones left).
Shape local_shape(const Shape& global, const std::vector<Placement>& placements, const DeviceMesh& mesh);

}  // namespace tp::dist
