#include "tp/io/non_finite.h"

#include <cstdint>
#include <cstring>

namespace tp::io {

namespace {

template <class Bits>
NonFinite scan_bits(const uint8_t* p, size_t n, Bits exponent_mask) {
  size_t count = 0, first = n;
#pragma omp parallel for reduction(+ : count) reduction(min : first) schedule(static) if (n > 65536)
  for (size_t i = 0; i < n; ++i) {
    Bits b;
    std::memcpy(&b, p + i * sizeof(Bits), sizeof(Bits));
    if ((b & exponent_mask) == exponent_mask) {
      ++count;
      if (i < first) first = i;
    }
  }
  return {count, first};
}

}  // namespace

NonFinite find_non_finite(const Tensor& t) {
  const auto* p = static_cast<const uint8_t*>(t.raw_data());
  const auto n = static_cast<size_t>(t.numel());
  switch (t.dtype()) {
    case DType::F32: return scan_bits<uint32_t>(p, n, 0x7f800000u);
    case DType::BF16: return scan_bits<uint16_t>(p, n, 0x7f80u);
    case DType::F16: return scan_bits<uint16_t>(p, n, 0x7c00u);
    default: return {};
  }
}

}  // namespace tp::io
