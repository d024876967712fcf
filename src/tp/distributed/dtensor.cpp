#include "tp/distributed/dtensor.h"

#include "tp/distributed/redistribute.h"

namespace tp::dist {
namespace {

std::vector<Placement> normalized(const std::vector<Placement>& ps, int64_t ndim, const DeviceMesh& mesh) {
  TP_CHECK(static_cast<int64_t>(ps.size()) == mesh.ndim(),
           "DTensor: {} placements {} for {}; give one placement per mesh dim", ps.size(), to_string(ps),
           mesh.to_string());
  std::vector<Placement> out;
  for (const Placement& p : ps) out.push_back(normalize(p, ndim));
  return out;
}

}  // namespace

DTensor::DTensor(Tensor local, DeviceMesh mesh, std::vector<Placement> placements, Shape shape)
    : local_(std::move(local)), mesh_(std::move(mesh)), placements_(std::move(placements)), shape_(std::move(shape)) {}

DTensor DTensor::from_local(Tensor local, const DeviceMesh& mesh, std::vector<Placement> placements,
                            std::optional<Shape> global_shape) {
  TP_CHECK(local.defined(), "DTensor::from_local: the local tensor is undefined");
  std::vector<Placement> ps = normalized(placements, local.dim(), mesh);
  Shape global;
  if (global_shape) {
    global = *global_shape;
    TP_CHECK(global.size() == local.shape().size(), "DTensor::from_local: global shape {} and local shape {} differ in rank",
             shape_str(global), shape_str(local.shape()));
  } else {
    // Undo the shards innermost mesh dim first: the sizes of each group's pieces add up.
    global = local.shape();
    for (int64_t m = mesh.ndim() - 1; m >= 0; --m) {
      auto d = shard_dim(ps[m], local.dim());
      if (!d) continue;
      Tensor size = Tensor::from_ints({global[*d]}, {1}, DType::I64);
      mesh.group(m).all_reduce(size, ReduceOp::Sum);
      global[*d] = static_cast<int64_t>(size.item());
    }
  }
  Shape expected = local_shape(global, ps, mesh);
  TP_CHECK(expected == local.shape(),
           "DTensor::from_local: local shape {} on mesh coordinate {} does not match global shape {} with placements "
           "{} (expected local shape {}; pieces follow torch.chunk's rule)",
           shape_str(local.shape()), mesh.ndim() ? mesh.coordinate(0) : 0, shape_str(global), dist::to_string(ps),
           shape_str(expected));
  return DTensor(std::move(local), mesh, std::move(ps), std::move(global));
}

DTensor DTensor::distribute_tensor(const Tensor& full, const DeviceMesh& mesh, std::vector<Placement> placements) {
  std::vector<Placement> replicated(mesh.ndim(), Replicate{});
  DTensor whole(full, mesh, replicated, full.shape());
  return whole.redistribute(std::move(placements));
}

DTensor DTensor::redistribute(std::vector<Placement> target) const {
  std::vector<Placement> tgt = normalized(target, static_cast<int64_t>(shape_.size()), mesh_);
  Tensor out = redistribute_local(local_, shape_, mesh_, placements_, tgt);
  return DTensor(std::move(out), mesh_, std::move(tgt), shape_);
}

Tensor DTensor::full_tensor() const {
  return redistribute(std::vector<Placement>(mesh_.ndim(), Replicate{})).local();
}

std::string DTensor::to_string() const {
  return fmt::format("DTensor(shape {}, {}, local {} {})", shape_str(shape_), dist::to_string(placements_),
                     shape_str(local_.shape()), dtype_name(local_.dtype()));
}

}  // namespace tp::dist
