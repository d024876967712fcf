#include "tp/ops/denormals.h"

#include <xmmintrin.h>

namespace tp::ops {

void flush_denormals_to_zero() {
  constexpr unsigned kFlushToZero = 0x8000, kDenormalsAreZero = 0x0040;  // MXCSR bits
  _mm_setcsr(_mm_getcsr() | kFlushToZero | kDenormalsAreZero);
#pragma omp parallel
  _mm_setcsr(_mm_getcsr() | kFlushToZero | kDenormalsAreZero);
}

}  // namespace tp::ops
