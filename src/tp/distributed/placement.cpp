#include "tp/distributed/placement.h"

#include "tp/distributed/device_mesh.h"

namespace tp::dist {

std::string to_string(const Placement& p) {
  if (auto* s = std::get_if<Shard>(&p)) return fmt::format("S({})", s->dim);
  if (auto* s = std::get_if<StridedShard>(&p)) return fmt::format("SS({},{})", s->dim, s->split_factor);
  if (std::holds_alternative<Replicate>(p)) return "R";
  return fmt::format("P({})", reduce_op_name(std::get<Partial>(p).op));
}

std::string to_string(const std::vector<Placement>& placements) {
  std::string out = "[";
  for (size_t i = 0; i < placements.size(); ++i) out += (i ? ", " : "") + to_string(placements[i]);
  return out + "]";
}

bool is_replicate(const Placement& p) { return std::holds_alternative<Replicate>(p); }
bool is_partial(const Placement& p) { return std::holds_alternative<Partial>(p); }

std::optional<int64_t> shard_dim(const Placement& p, int64_t ndim) {
  if (auto* s = std::get_if<Shard>(&p)) return normalize_dim(s->dim, ndim);
  if (auto* s = std::get_if<StridedShard>(&p)) return normalize_dim(s->dim, ndim);
  return std::nullopt;
}

Placement normalize(const Placement& p, int64_t ndim) {
  auto check = [&](int64_t d) {
    TP_CHECK(d >= -ndim && d < ndim, "placement {} names dim {} but the tensor has {} dims (valid: {}..{})",
             to_string(p), d, ndim, -ndim, ndim - 1);
    return d < 0 ? d + ndim : d;
  };
  if (auto* s = std::get_if<Shard>(&p)) return Shard{check(s->dim)};
  if (auto* s = std::get_if<StridedShard>(&p)) {
    TP_CHECK(s->split_factor > 0, "placement {}: split_factor must be positive", to_string(p));
    return StridedShard{check(s->dim), s->split_factor};
  }
  return p;
}

std::vector<ChunkSpan> local_spans(const Placement& p, int64_t n, int64_t parts, int64_t index) {
  if (std::holds_alternative<Shard>(p)) return {chunk_span(n, parts, index)};
  if (auto* s = std::get_if<StridedShard>(&p)) {
    TP_CHECK(n % s->split_factor == 0, "placement {}: dim size {} is not divisible by split_factor {}", to_string(p),
             n, s->split_factor);
    int64_t group = n / s->split_factor;
    std::vector<ChunkSpan> spans;
    for (int64_t g = 0; g < s->split_factor; ++g) {
      ChunkSpan c = chunk_span(group, parts, index);
      spans.push_back({g * group + c.offset, c.size});
    }
    return spans;
  }
  return {{0, n}};
}

Tensor local_piece(const Tensor& full, const Placement& p, int64_t parts, int64_t index) {
  if (auto d = shard_dim(p, full.dim())) {
    std::vector<Tensor> pieces;
    for (ChunkSpan span : local_spans(p, full.shape()[*d], parts, index))
      pieces.push_back(full.narrow(*d, span.offset, span.size));
    return pieces.size() == 1 ? pieces[0].clone() : cat(pieces, *d);
  }
  if (auto* partial = std::get_if<Partial>(&p); partial && partial->op == ReduceOp::Sum && index != 0)
    return Tensor::zeros(full.shape(), full.dtype());
  return full.clone();
}

Tensor assemble_pieces(const std::vector<Tensor>& pieces, const Placement& p, int64_t n) {
  TP_CHECK(!pieces.empty(), "assemble_pieces: no pieces");
  auto d = shard_dim(p, pieces[0].dim());
  TP_CHECK(d.has_value(), "assemble_pieces: placement {} is not a shard", to_string(p));
  int64_t parts = static_cast<int64_t>(pieces.size());
  if (std::holds_alternative<Shard>(p)) return cat(pieces, *d);
  // StridedShard: group g of the result is the g-th span of every piece, in rank order.
  int64_t f = std::get<StridedShard>(p).split_factor;
  std::vector<Tensor> ordered;
  std::vector<int64_t> cursor(parts, 0);
  for (int64_t g = 0; g < f; ++g)
    for (int64_t i = 0; i < parts; ++i) {
      int64_t len = local_spans(p, n, parts, i)[g].size;
      ordered.push_back(pieces[i].narrow(*d, cursor[i], len));
      cursor[i] += len;
    }
  return cat(ordered, *d);
}

Shape local_shape(const Shape& global, const std::vector<Placement>& placements, const DeviceMesh& mesh) {
  TP_CHECK(static_cast<int64_t>(placements.size()) == mesh.ndim(),
           "{} placements {} for a mesh of {} dims ({}); give one placement per mesh dim", placements.size(),
           to_string(placements), mesh.ndim(), mesh.to_string());
  Shape local = global;
  for (int64_t m = 0; m < mesh.ndim(); ++m) {
    Placement p = normalize(placements[m], static_cast<int64_t>(global.size()));
    if (auto d = shard_dim(p, static_cast<int64_t>(global.size()))) {
      int64_t total = 0;
      for (ChunkSpan span : local_spans(p, local[*d], mesh.size(m), mesh.coordinate(m))) total += span.size;
      local[*d] = total;
    }
  }
  return local;
}

}  // namespace tp::dist
