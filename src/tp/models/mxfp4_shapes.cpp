// The shapes of MXFP4 blocks and scales (apart from reading them, so that
// config checks can use them without the loader).
#include "tp/models/mxfp4.h"
#include "tp/tensor/shape.h"

namespace tp {

Shape mxfp4_blocks_shape(const std::string& name, const Shape& p) {
  TP_CHECK(p.size() == 3 && p[1] % kMxfp4Block == 0,
           "MXFP4 stores '{}' {} as blocks of 32 along its input dim (dim 1), which must be a multiple of 32", name,
           shape_str(p));
  return {p[0], p[2], p[1] / kMxfp4Block, kMxfp4Block / 2};
}

Shape mxfp4_scales_shape(const std::string& name, const Shape& p) {
  const Shape b = mxfp4_blocks_shape(name, p);
  return {b[0], b[1], b[2]};
}

}  // namespace tp
