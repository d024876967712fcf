#include "tp/tensor/random.h"

#include <cmath>

namespace tp {

uint64_t mix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

double uniform01(uint64_t seed, uint64_t counter) {
  uint64_t bits = mix64(mix64(seed) ^ (counter * 0xd1b54a32d192ed03ull));
  return static_cast<double>(bits >> 11) * 0x1.0p-53;
}

double standard_normal(uint64_t seed, uint64_t counter) {
  double u1 = uniform01(seed, 2 * counter);
  double u2 = uniform01(seed, 2 * counter + 1);
  if (u1 < 1e-300) u1 = 1e-300;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
}

}  // namespace tp
