#pragma once
// Element types and the scalar half-precision conversions. Vectorized bulk
// conversions live in convert.h.
#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>

namespace tp {

// U8: raw bytes (MXFP4 checkpoints' blocks and scales, dequantised at load).
enum class DType : uint8_t { F32, BF16, F16, I32, I64, U8 };

size_t dtype_size(DType dtype);
// "f32", "bf16", "f16", "i32", "i64", "u8"
const char* dtype_name(DType dtype);
// Accepts our names and the safetensors/torch spellings ("F32", "BF16", "float32",
// "bfloat16", "float16", "int32", "int64"); throws tp::Error listing them otherwise.
DType parse_dtype(std::string_view name);
bool is_floating(DType dtype);

// Storage type of one bf16 / f16 value.
struct bf16 {
  uint16_t bits;
};
struct f16 {
  uint16_t bits;
};

// Round to nearest even; NaN stays NaN.
inline bf16 to_bf16(float x) {
  uint32_t u;
  std::memcpy(&u, &x, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return bf16{static_cast<uint16_t>((u >> 16) | 0x40)};
  u += 0x7fffu + ((u >> 16) & 1u);
  return bf16{static_cast<uint16_t>(u >> 16)};
}
inline float to_f32(bf16 x) {
  uint32_t u = static_cast<uint32_t>(x.bits) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
f16 to_f16(float x);
float to_f32(f16 x);

template <class T>
struct dtype_of;
template <>
struct dtype_of<float> {
  static constexpr DType value = DType::F32;
};
template <>
struct dtype_of<bf16> {
  static constexpr DType value = DType::BF16;
};
template <>
struct dtype_of<f16> {
  static constexpr DType value = DType::F16;
};
template <>
struct dtype_of<int32_t> {
  static constexpr DType value = DType::I32;
};
template <>
struct dtype_of<int64_t> {
  static constexpr DType value = DType::I64;
};
template <>
struct dtype_of<uint8_t> {
  static constexpr DType value = DType::U8;
};

}  // namespace tp
