#pragma once
// Redistribute: move a DTensor's local piece from one placement list to another.
//
// Transition table for one mesh dim (group of W ranks, dim sizes by the chunk rule):
//   P(op)  -> R       all-reduce(op)
//   P(sum|avg) -> S(d) reduce-scatter(d)          (when no other mesh dim shards d)
//   S(d)   -> R       all-gather(d)               (uneven sizes gathered with their counts)
//   SS(d,f)-> R       all-gather(d), then regroup the f groups
//   S(d)   -> S(e)    all-to-all(split e, concat d) (when no other mesh dim shards d or e)
//   R      -> S/SS    local slice, no communication
//   R      -> P(sum)  keep the value on coordinate 0, zeros elsewhere
//   R      -> P(avg|max) keep the value everywhere
//   anything else     through R: first to R, then from R
// With several mesh dims the plan first moves mesh dims away from their source
// placement (last mesh dim first), then into the target (first mesh dim first).
// When a tensor dim is sharded by more than one mesh dim (nested shards), every
// mesh dim goes through R, which is always correct.
//
// Autograd: a local gradient represents the logical gradient G the way torch's
// DTensor does: Shard -> this rank's slice of G, Replicate -> all of G (the same
// on every rank), P(sum) -> G, P(avg) -> G / W. The backward of
// redistribute(src -> tgt) is therefore the redistribute of the gradient from
// tgt's gradient layout to src's (the adjoint collective: all-gather <->
// slice / reduce-scatter, all-reduce <-> identity, all-to-all <-> all-to-all back).
// P(max) is not differentiable.
#include <string>
#include <vector>

#include "tp/distributed/device_mesh.h"
#include "tp/distributed/placement.h"

namespace tp::dist {

struct TransformStep {
  int64_t mesh_dim;
  Placement from, to;
  Shape logical_shape;  // the tensor as the group of this mesh dim sees it (before the step)
  std::string to_string() const;  // "mesh dim 0: S(0) -> R on [10, 4]"
};

// Pure planning (no communication): testable without MPI. `mesh_sizes` and
// `coords` give the mesh and this rank's place in it.
std::vector<TransformStep> plan_redistribute(const Shape& global, const std::vector<Placement>& src,
                                             const std::vector<Placement>& tgt, const std::vector<int64_t>& mesh_sizes,
                                             const std::vector<int>& coords);
std::string to_string(const std::vector<TransformStep>& plan);

// Runs the plan on this rank's `local` (collective over the mesh). Differentiable:
// records one autograd entry whose backward redistributes the gradient back.
// Returns `local` itself when src == tgt.
Tensor redistribute_local(const Tensor& local, const Shape& global, const DeviceMesh& mesh,
                          const std::vector<Placement>& src, const std::vector<Placement>& tgt);

// The placements a gradient of a tensor with `p` arrives in (P(sum|avg) -> R; others unchanged).
std::vector<Placement> grad_placements(const std::vector<Placement>& p);

}  // namespace tp::dist
