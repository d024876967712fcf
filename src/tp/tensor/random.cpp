#include "tp/tensor/random.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "tp/core/parallel_for.h"
#include "tp/tensor/convert.h"

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

namespace {

// Values i in [begin, begin + len) of write_normal's stream; begin is even.
void fill_normal(float* out, uint64_t seed, int64_t begin, int64_t len, float std) {
  constexpr float kScale = 1.0f / 16777216.0f;  // 2^-24
  for (int64_t i = 0; i < len; i += 2) {
    const uint64_t bits = mix64(seed ^ mix64(static_cast<uint64_t>(begin + i) >> 1));
    const float u1 = static_cast<float>((bits >> 40) + 1) * kScale;  // (0, 1]: log is finite
    const float u2 = static_cast<float>(bits & 0xffffffu) * kScale;
    const float r = std * std::sqrt(-2.0f * std::log(u1));
    float sn, cs;
    sincosf(6.2831853f * u2, &sn, &cs);
    out[i] = r * cs;
    if (i + 1 < len) out[i + 1] = r * sn;
  }
}

}  // namespace

void write_normal(void* dst, DType dtype, int64_t n, uint64_t seed, float std) {
  const size_t es = dtype_size(dtype);
  // Blocks of f32 converted straight into dst: no full-size f32 temporary.
  constexpr int64_t kBlock = 4096;
  const int64_t blocks = (n + kBlock - 1) / kBlock;
  parallel_for(blocks, n > 65536, [&](int64_t b) {
    float buf[kBlock];
    const int64_t begin = b * kBlock, len = std::min(kBlock, n - begin);
    fill_normal(buf, seed, begin, len, std);
    convert(buf, DType::F32, static_cast<char*>(dst) + begin * es, dtype, static_cast<size_t>(len));
  });
}

void write_constant(void* dst, DType dtype, int64_t n, float value) {
  const std::vector<float> src(static_cast<size_t>(n), value);
  convert(src.data(), DType::F32, dst, dtype, static_cast<size_t>(n));
}

}  // namespace tp
