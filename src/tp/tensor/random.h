#pragma once
// Counter-based random numbers: value i of stream `seed` depends only on
// (seed, i), so results are identical whatever the thread count or machine.
#include <cstdint>

namespace tp {

uint64_t mix64(uint64_t x);  // splitmix64 finalizer
// Uniform in [0, 1) from (seed, counter).
double uniform01(uint64_t seed, uint64_t counter);
// Standard normal from (seed, counter) by Box-Muller.
double standard_normal(uint64_t seed, uint64_t counter);

}  // namespace tp
