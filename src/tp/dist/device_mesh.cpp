#include "tp/dist/device_mesh.h"

#include <set>

namespace tp::dist {

DeviceMesh::DeviceMesh(std::vector<int64_t> sizes, std::vector<std::string> dim_names)
    : DeviceMesh(world(), std::move(sizes), std::move(dim_names)) {}

DeviceMesh::DeviceMesh(ProcessGroup& group, std::vector<int64_t> sizes, std::vector<std::string> dim_names)
    : sizes_(std::move(sizes)), names_(std::move(dim_names)) {
  TP_CHECK(!sizes_.empty(), "DeviceMesh: at least one dimension is needed");
  TP_CHECK(names_.size() == sizes_.size(), "DeviceMesh: {} sizes {} but {} names [{}]", sizes_.size(),
           shape_str(sizes_), names_.size(), fmt::join(names_, ", "));
  std::set<std::string> unique(names_.begin(), names_.end());
  TP_CHECK(unique.size() == names_.size(), "DeviceMesh: dim names [{}] must be distinct", fmt::join(names_, ", "));
  int64_t product = 1;
  for (int64_t s : sizes_) {
    TP_CHECK(s > 0, "DeviceMesh: sizes {} must be positive", shape_str(sizes_));
    product *= s;
  }
  TP_CHECK(product == group.size(),
           "DeviceMesh: sizes {} (names [{}]) multiply to {} but there are {} ranks; the sizes must multiply to the "
           "number of ranks (e.g. tprun --nproc-per-node {})",
           shape_str(sizes_), fmt::join(names_, ", "), product, group.size(), product);
  // Row-major coordinates of this rank.
  coords_.assign(sizes_.size(), 0);
  int64_t rest = group.rank();
  for (int64_t d = ndim() - 1; d >= 0; --d) {
    coords_[d] = static_cast<int>(rest % sizes_[d]);
    rest /= sizes_[d];
  }
  // The group along dim d: ranks sharing every other coordinate (color), ordered by coordinate d (key).
  for (int64_t d = 0; d < ndim(); ++d) {
    int64_t color = 0;
    for (int64_t e = 0; e < ndim(); ++e)
      if (e != d) color = color * sizes_[e] + coords_[e];
    groups_.push_back(ndim() == 1 ? group.split(0, group.rank()) : group.split(static_cast<int>(color), coords_[d]));
  }
}

DeviceMesh DeviceMesh::tp_mesh(int64_t tp_size) {
  TP_CHECK(tp_size == world_size(), "tp size {} must equal the number of ranks {} (start {} ranks, e.g. tprun "
           "--nproc-per-node {})", tp_size, world_size(), tp_size, tp_size);
  return DeviceMesh({tp_size}, {"tp"});
}

int64_t DeviceMesh::dim_index(const std::string& name) const {
  for (size_t i = 0; i < names_.size(); ++i)
    if (names_[i] == name) return static_cast<int64_t>(i);
  fail("DeviceMesh has no dim named '{}'; valid names: [{}]", name, fmt::join(names_, ", "));
}

DeviceMesh DeviceMesh::operator[](const std::string& name) const {
  int64_t d = dim_index(name);
  DeviceMesh sub;
  sub.sizes_ = {sizes_[d]};
  sub.names_ = {name};
  sub.coords_ = {coords_[d]};
  sub.groups_ = {groups_[d]};
  return sub;
}

int64_t DeviceMesh::size(int64_t dim) const { return sizes_.at(normalize_dim(dim, ndim())); }

int64_t DeviceMesh::numel() const { return tp::numel(sizes_); }

int DeviceMesh::coordinate(int64_t dim) const { return coords_.at(normalize_dim(dim, ndim())); }

ProcessGroup& DeviceMesh::group(int64_t dim) const { return *groups_.at(normalize_dim(dim, ndim())); }

std::string DeviceMesh::to_string() const {
  return fmt::format("DeviceMesh({}, names=[{}])", shape_str(sizes_), fmt::join(names_, ", "));
}

bool DeviceMesh::operator==(const DeviceMesh& other) const {
  return sizes_ == other.sizes_ && names_ == other.names_ && groups_ == other.groups_;
}

}  // namespace tp::dist
