#pragma once
// Round-to-nearest quantization of one f32 weight into the values a quantized
// checkpoint stores (models/quantize_rtn.h has the rules and writes the formats'
// tensors from these). It is in io/ with the formats' word packing
// (io/quantized_words.h): both are a host-side conversion into a file format,
// run once by `tp quantize`, whose scales are rounded to the dtype the file
// stores them in; nothing here runs in a model's step.
#include <cstdint>
#include <string>
#include <vector>

#include "tp/tensor/tensor.h"

namespace tp::io {

struct RoundToNearest {
  int bits = 4;
  bool sym = false;
  // GPTQ v1 stores z - 1 and its readers add the 1 back without wrapping: a
  // group's zero point must then be at least 1.
  bool zero_point_minus_one = false;
  DType scale_dtype = DType::F16;  // scales are rounded up to values of it
};

struct RoundedWeight {
  Tensor codes;   // u8 [N, K]
  Tensor zeros;   // u8 [N, groups]
  Tensor scales;  // f32 [N, groups], values of the scale dtype
};

// w f32 [N, K] by groups: input feature k belongs to group[k] (< groups). Errors
// name `module`: a non-finite weight, a scale over the scale dtype's range.
RoundedWeight round_to_nearest(const RoundToNearest& o, const Tensor& w, const std::vector<int32_t>& group,
                               int64_t groups, const std::string& module);

}  // namespace tp::io
