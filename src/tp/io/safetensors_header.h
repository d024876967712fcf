#pragma once
// The safetensors header: 8 bytes little-endian header length N, N bytes of
// UTF-8 JSON {"__metadata__": {str: str}, name: {"dtype", "shape",
// "data_offsets": [begin, end]}}, then the data area; offsets are relative to
// it. Parsing is a pure function of the bytes so that the fuzzer can drive it.
#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <map>
#include <string>
#include <vector>

#include "tp/tensor/dtype.h"
#include "tp/tensor/shape.h"

namespace tp::io {

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  Shape shape;
  std::filesystem::path file;
  size_t data_begin = 0;  // relative to the data area
  size_t nbytes = 0;
};

struct SafetensorsHeader {
  std::vector<TensorInfo> tensors;  // sorted by data_begin (the file's layout order)
  std::map<std::string, std::string> metadata;
  size_t data_offset = 0;  // 8 + header length
  size_t data_size = 0;    // bytes after the header
};

// Largest header accepted (the reference implementation's limit too).
inline constexpr size_t kMaxHeaderBytes = 100u << 20;

// Validates everything the header promises about `bytes` (the whole file, `size`
// bytes): length within the file, JSON, entry fields, dtypes, shape x dtype size
// == byte span, spans inside the data area and not overlapping. Throws tp::Error
// naming `file` and, when known, the tensor.
SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t size, const std::filesystem::path& file);

// "F32", "BF16", ... as safetensors spells them.
const char* safetensors_dtype_name(DType dtype);

}  // namespace tp::io
