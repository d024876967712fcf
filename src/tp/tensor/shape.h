#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace tp {

// Sizes of each dimension, outermost first (row-major).
using Shape = std::vector<int64_t>;

int64_t numel(const Shape& shape);
// "[2, 3, 4]"
std::string shape_str(const Shape& shape);
// Maps a possibly negative dimension index into [0, rank); throws naming both.
int64_t normalize_dim(int64_t dim, int64_t rank);

// A shape seen as [outer, n, inner] around dimension `dim` (already normalized).
struct DimSplit {
  int64_t outer = 1, n = 1, inner = 1;
};
DimSplit split_at(const Shape& shape, int64_t dim);

}  // namespace tp
