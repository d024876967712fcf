#include "tp/parallel/shards.h"

#include <cstring>

namespace tp::parallel {

namespace {

// [dim, spans..., (offset, size) pairs]: what a rank's shard says, as integers.
std::vector<int64_t> encode(const nn::ParamShard& s) {
  std::vector<int64_t> v{s.dim, static_cast<int64_t>(s.spans.size())};
  for (const ChunkSpan& span : s.spans) {
    v.push_back(span.offset);
    v.push_back(span.size);
  }
  return v;
}

bool same_slice(const nn::ParamShard& a, const nn::ParamShard& b) { return encode(a) == encode(b); }

}  // namespace

std::vector<nn::ParamShard> all_shards(const nn::ParamShard& mine, dist::ProcessGroup& group) {
  std::vector<int64_t> code = encode(mine);
  std::vector<int64_t> sizes;
  Tensor all = group.all_gather_uneven(Tensor::from_ints(code, {static_cast<int64_t>(code.size())}), 0, &sizes);
  std::vector<int64_t> flat = all.to_int_vector();
  std::vector<nn::ParamShard> out;
  size_t at = 0;
  for (int64_t n : sizes) {
    nn::ParamShard s;
    s.dim = flat[at];
    int64_t spans = flat[at + 1];
    TP_CHECK(n == 2 + 2 * spans, "all_shards: a rank sent {} integers for {} spans", n, spans);
    for (int64_t i = 0; i < spans; ++i) s.spans.push_back({flat[at + 2 + 2 * i], flat[at + 3 + 2 * i]});
    // Only the slice matters here; the placement stays this rank's (equal on every rank).
    s.placement = mine.placement;
    out.push_back(std::move(s));
    at += static_cast<size_t>(n);
  }
  return out;
}

int first_holder(const std::vector<nn::ParamShard>& shards, int rank) {
  for (int r = 0; r < rank; ++r)
    if (same_slice(shards[r], shards[rank])) return r;
  return rank;
}

Tensor gather_full(const Tensor& local, const Shape& global_shape, const std::vector<nn::ParamShard>& shards,
                   dist::ProcessGroup& group) {
  const nn::ParamShard& mine = shards.at(group.rank());
  if (mine.replicated()) {
    Tensor full = local.clone();
    group.broadcast(full, 0);
    return full;
  }
  const int64_t d = mine.dim;
  std::vector<int64_t> sizes;
  Tensor pieces = group.all_gather_uneven(local, d, &sizes);
  Tensor full = Tensor::empty(global_shape, local.dtype());
  // [outer, n, inner] views of both: each span is `size * inner` contiguous
  // elements per outer index, at offset `offset * inner` in the full tensor.
  const DimSplit p = split_at(pieces.shape(), d), f = split_at(global_shape, d);
  const size_t esize = dtype_size(local.dtype());
  const char* src = static_cast<const char*>(pieces.raw_data());
  char* dst = static_cast<char*>(full.raw_data());
  int64_t at = 0;  // where the current rank's piece starts in `pieces` along d
  for (size_t r = 0; r < shards.size(); ++r) {
    int64_t described = 0;
    for (const ChunkSpan& span : shards[r].spans) described += span.size;
    TP_CHECK(described == sizes[r], "gather_full: rank {} sent a piece of {} along dim {}, its shard describes {}",
             r, sizes[r], d, described);
    for (const ChunkSpan& span : shards[r].spans) {
      const size_t bytes = static_cast<size_t>(span.size * f.inner) * esize;
      for (int64_t o = 0; o < f.outer; ++o)
        std::memcpy(dst + static_cast<size_t>((o * f.n + span.offset) * f.inner) * esize,
                    src + static_cast<size_t>((o * p.n + at) * p.inner) * esize, bytes);
      at += span.size;
    }
  }
  return full;
}

}  // namespace tp::parallel
