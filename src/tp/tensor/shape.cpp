#include "tp/tensor/shape.h"

#include "tp/core/error.h"

namespace tp {

int64_t numel(const Shape& shape) {
  int64_t n = 1;
  for (int64_t s : shape) n *= s;
  return n;
}

std::string shape_str(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

int64_t normalize_dim(int64_t dim, int64_t rank) {
  int64_t d = dim < 0 ? dim + rank : dim;
  TP_CHECK(d >= 0 && d < rank, "dimension {} is out of range for a tensor of rank {} (accepted: {}..{})",
           dim, rank, -rank, rank - 1);
  return d;
}

DimSplit split_at(const Shape& shape, int64_t dim) {
  DimSplit s;
  for (int64_t i = 0; i < dim; ++i) s.outer *= shape[i];
  s.n = shape[dim];
  for (size_t i = dim + 1; i < shape.size(); ++i) s.inner *= shape[i];
  return s;
}

}  // namespace tp
