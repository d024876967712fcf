#include "tp/distributed/device_mesh.h"

#include <algorithm>
#include <set>

namespace tp::dist {

DeviceMesh::DeviceMesh(std::vector<int64_t> sizes, std::vector<std::string> dim_names)
    : DeviceMesh(world(), std::move(sizes), std::move(dim_names)) {}

DeviceMesh::DeviceMesh(ProcessGroup& group, std::vector<int64_t> sizes, std::vector<std::string> dim_names)
    : sizes_(std::move(sizes)), names_(std::move(dim_names)), root_(&group) {
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
  std::vector<std::string> valid = names_;
  for (const Flattened& f : flattened_) valid.push_back(f.name);
  fail("DeviceMesh has no dim named '{}'; valid names: [{}]", name, fmt::join(valid, ", "));
}

const DeviceMesh::Flattened* DeviceMesh::find_flattened(const std::string& name) const {
  for (const Flattened& f : flattened_)
    if (f.name == name) return &f;
  return nullptr;
}

bool DeviceMesh::has_dim(const std::string& name) const {
  return find_flattened(name) != nullptr || std::find(names_.begin(), names_.end(), name) != names_.end();
}

ProcessGroup& DeviceMesh::root_group() const {
  TP_CHECK(root_ != nullptr, "{} is a sub-mesh: it has no root group (ask the mesh it came from)", to_string());
  return *root_;
}

ProcessGroup& DeviceMesh::group(const std::string& name) const {
  if (const Flattened* f = find_flattened(name)) return *f->group;
  return group(dim_index(name));
}

int64_t DeviceMesh::size(const std::string& name) const {
  if (const Flattened* f = find_flattened(name)) return f->size;
  return size(dim_index(name));
}

int DeviceMesh::coordinate(const std::string& name) const {
  if (const Flattened* f = find_flattened(name)) return f->coordinate;
  return coordinate(dim_index(name));
}

DeviceMesh DeviceMesh::operator[](const std::string& name) const {
  DeviceMesh sub;
  sub.names_ = {name};
  if (const Flattened* f = find_flattened(name)) {
    sub.sizes_ = {f->size};
    sub.coords_ = {f->coordinate};
    sub.groups_ = {f->group};
    return sub;
  }
  int64_t d = dim_index(name);
  sub.sizes_ = {sizes_[d]};
  sub.coords_ = {coords_[d]};
  sub.groups_ = {groups_[d]};
  return sub;
}

DeviceMesh DeviceMesh::with_flattened(const std::vector<std::string>& dims, const std::string& name) const {
  TP_CHECK(root_ != nullptr, "DeviceMesh::with_flattened: {} is a sub-mesh; flatten dims of the mesh it came from",
           to_string());
  TP_CHECK(!dims.empty(), "DeviceMesh::with_flattened: no dims to flatten into '{}'", name);
  TP_CHECK(!has_dim(name), "DeviceMesh::with_flattened: {} already has a dim named '{}'", to_string(), name);
  std::vector<bool> inside(sizes_.size(), false);
  for (const std::string& d : dims) {
    const int64_t i = dim_index(d);
    TP_CHECK(!inside[i], "DeviceMesh::with_flattened: dim '{}' is listed twice", d);
    inside[i] = true;
  }
  Flattened f{name, 1, 0, nullptr};
  int64_t color = 0;
  for (int64_t d = 0; d < ndim(); ++d) {
    if (inside[d]) {
      f.coordinate = static_cast<int>(f.coordinate * sizes_[d] + coords_[d]);
      f.size *= sizes_[d];
    } else {
      color = color * sizes_[d] + coords_[d];
    }
  }
  f.group = root_->split(static_cast<int>(color), f.coordinate);
  DeviceMesh out = *this;
  out.flattened_.push_back(std::move(f));
  return out;
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
