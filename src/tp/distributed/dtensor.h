#pragma once
// DTensor: this rank's local tensor plus how it relates to the logical (global)
// tensor: a mesh, one placement per mesh dim, and the global shape.
//
//   auto mesh = DeviceMesh::tp_mesh(world_size());
//   DTensor w = DTensor::distribute_tensor(full, mesh, {Shard(0)});   // rows split (10 rows, 4 ranks: 3,3,3,1)
//   DTensor r = w.redistribute({Replicate{}});                         // all-gather
//   Tensor back = w.full_tensor();                                     // == full on every rank
//
// redistribute/full_tensor/distribute_tensor are differentiable (see redistribute.h
// for what a local gradient means); from_local keeps the local tensor's autograd history.
#include <optional>
#include <vector>

#include "tp/distributed/device_mesh.h"
#include "tp/distributed/placement.h"

namespace tp::dist {

class DTensor {
 public:
  // Wraps this rank's piece. Without `global_shape`, it is inferred assuming the
  // chunk rule (for Shard: one size exchange over the mesh dim's group; every
  // rank must call). With it, the local shape is checked against it.
  static DTensor from_local(Tensor local, const DeviceMesh& mesh, std::vector<Placement> placements,
                            std::optional<Shape> global_shape = {});
  // Every rank passes the same `full` and keeps its piece (no communication).
  static DTensor distribute_tensor(const Tensor& full, const DeviceMesh& mesh, std::vector<Placement> placements);

  const Tensor& local() const { return local_; }
  const Shape& shape() const { return shape_; }  // global
  const std::vector<Placement>& placements() const { return placements_; }
  const DeviceMesh& mesh() const { return mesh_; }
  DType dtype() const { return local_.dtype(); }

  DTensor redistribute(std::vector<Placement> target) const;
  Tensor full_tensor() const;  // the global tensor on every rank
  // "DTensor(shape [10, 4], [S(0)], local [3, 4] f32)"
  std::string to_string() const;

 private:
  DTensor(Tensor local, DeviceMesh mesh, std::vector<Placement> placements, Shape shape);
  Tensor local_;
  DeviceMesh mesh_;
  std::vector<Placement> placements_;
  Shape shape_;
};

}  // namespace tp::dist
