#pragma once
// Counter-based random numbers: value i of stream `seed` depends only on
// (seed, i), so results are identical whatever the thread count or machine.
#include <cstdint>

#include "tp/tensor/dtype.h"

namespace tp {

uint64_t mix64(uint64_t x);  // splitmix64 finalizer
// Uniform in [0, 1) from (seed, counter).
double uniform01(uint64_t seed, uint64_t counter);
// Standard normal from (seed, counter) by Box-Muller.
double standard_normal(uint64_t seed, uint64_t counter);

// Writes n values N(0, std) of stream `seed`, as `dtype`, to dst: Box-Muller in
// f32, both outputs used, one 64-bit hash per pair (24 bits per uniform), so
// value i depends only on (seed, i) and any thread split writes the same bytes.
// About 4x faster than standard_normal (double precision, one output per pair),
// which matters for the initial weights of multi-billion-parameter presets.
void write_normal(void* dst, DType dtype, int64_t n, uint64_t seed, float std);
// Writes n copies of `value`, as `dtype`, to dst.
void write_constant(void* dst, DType dtype, int64_t n, float value);

}  // namespace tp
