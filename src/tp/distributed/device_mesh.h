#pragma once
// DeviceMesh: an N-d grid of ranks with named dims, row-major. For sizes {2, 4}
// named {"dp", "tp"} on 8 ranks:
//   rank:        0 1 2 3 | 4 5 6 7
//   dp coord:    0 0 0 0 | 1 1 1 1
//   tp coord:    0 1 2 3 | 0 1 2 3
//   mesh["tp"]:  ranks 0-3 form one 1-D mesh, 4-7 another (each with its own group)
//   mesh["dp"]:  {0,4} {1,5} {2,6} {3,7}
// Copies share the process groups.
#include <memory>
#include <string>
#include <vector>

#include "tp/distributed/process_group.h"

namespace tp::dist {

class DeviceMesh {
 public:
  // Over the world group; the product of sizes must equal the world size.
  DeviceMesh(std::vector<int64_t> sizes, std::vector<std::string> dim_names);
  // Over `group` instead of the world (tests; nested meshes).
  DeviceMesh(ProcessGroup& group, std::vector<int64_t> sizes, std::vector<std::string> dim_names);
  // 1-D {"tp"} over the world; tp_size must equal the world size.
  static DeviceMesh tp_mesh(int64_t tp_size);

  // The 1-D sub-mesh along `name` (a dim or a flattened dim) that contains this rank.
  DeviceMesh operator[](const std::string& name) const;
  // torch's mesh[dims]._flatten(name): a copy of this mesh that also answers to
  // `name`, the 1-D mesh of the ranks sharing every coordinate outside `dims`
  // (ordered row-major over `dims`). E.g. {"dp_replicate", "dp_shard"} -> "dp".
  // Collective over the mesh's ranks.
  DeviceMesh with_flattened(const std::vector<std::string>& dims, const std::string& name) const;
  bool has_dim(const std::string& name) const;  // a dim or a flattened dim
  // Every rank of the mesh (the group it was built over; not for sub-meshes).
  ProcessGroup& root_group() const;

  int64_t ndim() const { return static_cast<int64_t>(sizes_.size()); }
  int64_t size(int64_t dim = 0) const;
  int64_t numel() const;  // all ranks of the mesh
  int coordinate(int64_t dim) const;
  ProcessGroup& group(int64_t dim = 0) const;
  // By dim name: styles ask for mesh.group("tp"), so they work on any mesh that has a "tp" dim.
  ProcessGroup& group(const std::string& name) const;
  int64_t size(const std::string& name) const;
  int coordinate(const std::string& name) const;
  const std::vector<std::string>& dim_names() const { return names_; }
  const std::vector<int64_t>& sizes() const { return sizes_; }
  int64_t dim_index(const std::string& name) const;  // error lists the valid names
  // "DeviceMesh([2, 4], names=[dp, tp])"
  std::string to_string() const;

  bool operator==(const DeviceMesh& other) const;

 private:
  DeviceMesh() = default;
  std::vector<int64_t> sizes_;
  std::vector<std::string> names_;
  std::vector<int> coords_;
  std::vector<std::shared_ptr<ProcessGroup>> groups_;  // one per mesh dim
  ProcessGroup* root_ = nullptr;                       // the group the mesh spans (not for sub-meshes)
  struct Flattened {
    std::string name;
    int64_t size = 1;
    int coordinate = 0;
    std::shared_ptr<ProcessGroup> group;
  };
  std::vector<Flattened> flattened_;
  const Flattened* find_flattened(const std::string& name) const;
};

}  // namespace tp::dist
