#include "tp/distributed/redistribute.h"

#include "tp/autograd/tape.h"
#include "tp/ops/elementwise.h"

namespace tp::dist {
namespace {

std::vector<Placement> normalized(const std::vector<Placement>& ps, int64_t ndim) {
  std::vector<Placement> out;
  for (const Placement& p : ps) out.push_back(normalize(p, ndim));
  return out;
}

// The shape mesh dim `i`'s group sees: the global shape cut by every other mesh
// dim's current shard (in mesh order, like local_shape).
Shape logical_shape_for(int64_t i, const Shape& global, const std::vector<Placement>& cur,
                        const std::vector<int64_t>& sizes, const std::vector<int>& coords) {
  Shape shape = global;
  int64_t ndim = static_cast<int64_t>(global.size());
  for (size_t j = 0; j < cur.size(); ++j) {
    if (static_cast<int64_t>(j) == i) continue;
    if (auto d = shard_dim(cur[j], ndim)) {
      int64_t total = 0;
      for (ChunkSpan s : local_spans(cur[j], shape[*d], sizes[j], coords[j])) total += s.size;
      shape[*d] = total;
    }
  }
  return shape;
}

bool has_nested_shards(const std::vector<Placement>& ps, int64_t ndim) {
  std::vector<int> count(ndim, 0);
  for (const Placement& p : ps)
    if (auto d = shard_dim(p, ndim))
      if (++count[*d] > 1) return true;
  return false;
}

bool sharded_by_other(const std::vector<Placement>& cur, size_t i, int64_t d, int64_t ndim) {
  for (size_t j = 0; j < cur.size(); ++j)
    if (j != i && shard_dim(cur[j], ndim) == d) return true;
  return false;
}

// One step on this rank's local tensor `t`, over the group of mesh dim `step.mesh_dim`.
Tensor run_step(const Tensor& t, const TransformStep& step, const DeviceMesh& mesh) {
  ProcessGroup& g = mesh.group(step.mesh_dim);
  int64_t w = g.size();
  int64_t ndim = t.dim();
  const Placement& from = step.from;
  const Placement& to = step.to;
  if (auto* p = std::get_if<Partial>(&from)) {
    if (is_replicate(to)) {
      Tensor out = t.clone();
      g.all_reduce(out, p->op);
      return out;
    }
    return g.reduce_scatter(t, *shard_dim(to, ndim), p->op);  // planner only emits P -> S
  }
  if (is_replicate(from)) return local_piece(t, to, w, g.rank());
  int64_t d = *shard_dim(from, ndim);
  int64_t n = step.logical_shape[d];
  if (std::holds_alternative<Shard>(from) && std::holds_alternative<Shard>(to))
    return g.all_to_all(t, *shard_dim(to, ndim), d);
  // Shard or StridedShard -> Replicate.
  if (std::holds_alternative<Shard>(from))
    return n % w == 0 ? g.all_gather(t, d) : g.all_gather_uneven(t, d);
  std::vector<int64_t> sizes;
  Tensor gathered = g.all_gather_uneven(t, d, &sizes);
  std::vector<Tensor> pieces;
  int64_t offset = 0;
  for (int64_t s : sizes) {
    pieces.push_back(gathered.narrow(d, offset, s));
    offset += s;
  }
  return assemble_pieces(pieces, from, n);
}

Tensor run_plan(const Tensor& local, const std::vector<TransformStep>& plan, const DeviceMesh& mesh) {
  Tensor t = local;
  for (const TransformStep& step : plan) t = run_step(t, step, mesh);
  return t;
}

// Multiplies by `factor` into a new f32 tensor (gradients of P(avg)).
Tensor scaled(const Tensor& g, double factor) { return ops::scale(g, factor); }

double avg_factor(const std::vector<Placement>& ps, const DeviceMesh& mesh) {
  double f = 1;
  for (size_t m = 0; m < ps.size(); ++m)
    if (auto* p = std::get_if<Partial>(&ps[m]); p && p->op == ReduceOp::Avg) f *= static_cast<double>(mesh.size(m));
  return f;
}

}  // namespace

std::string TransformStep::to_string() const {
  return fmt::format("mesh dim {}: {} -> {} on {}", mesh_dim, dist::to_string(from), dist::to_string(to),
                     shape_str(logical_shape));
}

std::string to_string(const std::vector<TransformStep>& plan) {
  std::string out;
  for (const TransformStep& s : plan) out += s.to_string() + "\n";
  return out;
}

std::vector<TransformStep> plan_redistribute(const Shape& global, const std::vector<Placement>& src_in,
                                             const std::vector<Placement>& tgt_in,
                                             const std::vector<int64_t>& mesh_sizes, const std::vector<int>& coords) {
  size_t n = mesh_sizes.size();
  TP_CHECK(src_in.size() == n && tgt_in.size() == n,
           "redistribute: {} source and {} target placements for a mesh of {} dims; give one per mesh dim",
           src_in.size(), tgt_in.size(), n);
  int64_t ndim = static_cast<int64_t>(global.size());
  std::vector<Placement> src = normalized(src_in, ndim), tgt = normalized(tgt_in, ndim);
  std::vector<TransformStep> plan;
  if (src == tgt) return plan;
  bool nested = has_nested_shards(src, ndim) || has_nested_shards(tgt, ndim);
  std::vector<Placement> cur = src;
  // Phase A: leave the source placements, innermost mesh dim first.
  for (size_t k = n; k-- > 0;) {
    if (is_replicate(cur[k])) continue;
    bool is_shard = shard_dim(cur[k], ndim).has_value();
    if (cur[k] == tgt[k] && !(nested && is_shard)) continue;
    Placement to = Replicate{};
    if (!nested) {
      auto d_to = std::holds_alternative<Shard>(tgt[k]) ? shard_dim(tgt[k], ndim) : std::nullopt;
      if (d_to && is_partial(cur[k]) && !sharded_by_other(cur, k, *d_to, ndim)) to = tgt[k];
      if (d_to && std::holds_alternative<Shard>(cur[k])) {
        int64_t d_from = *shard_dim(cur[k], ndim);
        if (d_from != *d_to && !sharded_by_other(cur, k, d_from, ndim) && !sharded_by_other(cur, k, *d_to, ndim))
          to = tgt[k];
      }
    }
    plan.push_back({static_cast<int64_t>(k), cur[k], to, logical_shape_for(k, global, cur, mesh_sizes, coords)});
    cur[k] = to;
  }
  // Phase B: enter the target placements from Replicate, outermost mesh dim first.
  for (size_t k = 0; k < n; ++k) {
    if (cur[k] == tgt[k]) continue;
    plan.push_back({static_cast<int64_t>(k), cur[k], tgt[k], logical_shape_for(k, global, cur, mesh_sizes, coords)});
    cur[k] = tgt[k];
  }
  return plan;
}

std::vector<Placement> grad_placements(const std::vector<Placement>& ps) {
  std::vector<Placement> out;
  for (const Placement& p : ps) out.push_back(is_partial(p) ? Placement{Replicate{}} : p);
  return out;
}

Tensor redistribute_local(const Tensor& local, const Shape& global, const DeviceMesh& mesh,
                          const std::vector<Placement>& src, const std::vector<Placement>& tgt) {
  std::vector<int> coords;
  for (int64_t m = 0; m < mesh.ndim(); ++m) coords.push_back(mesh.coordinate(m));
  std::vector<TransformStep> plan = plan_redistribute(global, src, tgt, mesh.sizes(), coords);
  if (plan.empty()) return local;
  Tensor out = run_plan(local, plan, mesh);
  if (autograd::needs_grad({local})) {
    for (const std::vector<Placement>* ps : {&src, &tgt})
      for (const Placement& p : *ps)
        if (auto* partial = std::get_if<Partial>(&p))
          TP_CHECK(partial->op != ReduceOp::Max,
                   "redistribute {} -> {}: P(max) is not differentiable; use P(sum) or P(avg), or run under "
                   "NoGradGuard",
                   to_string(src), to_string(tgt));
    // The gradient goes back from tgt's gradient layout to src's.
    std::vector<TransformStep> back =
        plan_redistribute(global, grad_placements(tgt), grad_placements(src), mesh.sizes(), coords);
    double to_logical = avg_factor(tgt, mesh), from_logical = 1.0 / avg_factor(src, mesh);
    autograd::record("redistribute", {local}, {out},
                     [back, mesh, to_logical, from_logical](const std::vector<Tensor>& grads) -> std::vector<Tensor> {
                       Tensor g = to_logical == 1.0 ? grads[0] : scaled(grads[0], to_logical);
                       g = run_plan(g, back, mesh);
                       return {from_logical == 1.0 ? g : scaled(g, from_logical)};
                     });
  }
  return out;
}

}  // namespace tp::dist
