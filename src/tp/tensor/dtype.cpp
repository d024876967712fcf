#include "tp/tensor/dtype.h"

#include <immintrin.h>

#include "tp/core/error.h"

namespace tp {

size_t dtype_size(DType dtype) {
  switch (dtype) {
    case DType::F32: return 4;
    case DType::BF16: return 2;
    case DType::F16: return 2;
    case DType::I32: return 4;
    case DType::I64: return 8;
    case DType::U8: return 1;
  }
  return 0;
}

const char* dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "f32";
    case DType::BF16: return "bf16";
    case DType::F16: return "f16";
    case DType::I32: return "i32";
    case DType::I64: return "i64";
    case DType::U8: return "u8";
  }
  return "?";
}

DType parse_dtype(std::string_view name) {
  if (name == "f32" || name == "F32" || name == "float32" || name == "float") return DType::F32;
  if (name == "bf16" || name == "BF16" || name == "bfloat16") return DType::BF16;
  if (name == "f16" || name == "F16" || name == "float16" || name == "half") return DType::F16;
  if (name == "i32" || name == "I32" || name == "int32") return DType::I32;
  if (name == "i64" || name == "I64" || name == "int64") return DType::I64;
  if (name == "u8" || name == "U8" || name == "uint8") return DType::U8;
  fail("unknown dtype '{}'; supported: f32, bf16, f16, i32, i64, u8 (or F32, BF16, F16, I32, I64, U8, "
       "float32, bfloat16, float16, int32, int64, uint8)",
       name);
}

bool is_floating(DType dtype) {
  return dtype == DType::F32 || dtype == DType::BF16 || dtype == DType::F16;
}

// F16C is part of x86-64-v3, so the hardware conversion is always available.
f16 to_f16(float x) {
  return f16{static_cast<uint16_t>(_cvtss_sh(x, _MM_FROUND_TO_NEAREST_INT))};
}
float to_f32(f16 x) { return _cvtsh_ss(x.bits); }

}  // namespace tp
