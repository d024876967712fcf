#include "tp/io/safetensors_header.h"

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cstring>
#include <limits>

#include "tp/core/error.h"

namespace tp::io {

namespace {

using nlohmann::json;

const char* kAccepted = "F32, BF16, F16, I32, I64, U8";

DType parse_st_dtype(const std::string& s, const std::string& where) {
  if (s == "F32") return DType::F32;
  if (s == "BF16") return DType::BF16;
  if (s == "F16") return DType::F16;
  if (s == "I32") return DType::I32;
  if (s == "I64") return DType::I64;
  if (s == "U8") return DType::U8;
  fail("{}: unknown or unsupported dtype '{}'; accepted: {}", where, s, kAccepted);
}

size_t to_size(const json& v, const std::string& where, const char* what) {
  TP_CHECK(v.is_number_unsigned() || (v.is_number_integer() && v.get<int64_t>() >= 0),
           "{}: {} must be a non-negative integer, got {}", where, what, v.dump());
  return static_cast<size_t>(v.get<uint64_t>());
}

}  // namespace

const char* safetensors_dtype_name(DType dtype) {
  switch (dtype) {
    case DType::F32: return "F32";
    case DType::BF16: return "BF16";
    case DType::F16: return "F16";
    case DType::I32: return "I32";
    case DType::I64: return "I64";
    case DType::U8: return "U8";
  }
  return "?";
}

SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t size, const std::filesystem::path& path) {
  const std::string file = path.string();
  TP_CHECK(size >= 8, "{}: file is {} bytes, shorter than the 8-byte header length of a safetensors file", file, size);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | bytes[i];  // little-endian
  TP_CHECK(n <= kMaxHeaderBytes, "{}: header length {} is larger than the {} bytes allowed", file, n, kMaxHeaderBytes);
  TP_CHECK(n <= size - 8, "{}: header length {} runs past the end of the file ({} bytes); truncated or not safetensors",
           file, n, size);
  TP_CHECK(n >= 2 && bytes[8] == '{', "{}: header does not start with '{{'; not a safetensors file", file);

  json j;
  try {
    // The parser rejects ill-formed UTF-8 inside strings.
    j = json::parse(bytes + 8, bytes + 8 + n);
  } catch (const json::exception& e) {
    fail("{}: header is not valid JSON: {}", file, e.what());
  }
  TP_CHECK(j.is_object(), "{}: header must be a JSON object, got {}", file, j.type_name());

  SafetensorsHeader h;
  h.data_offset = 8 + static_cast<size_t>(n);
  h.data_size = size - h.data_offset;
  for (auto it = j.begin(); it != j.end(); ++it) {
    const std::string& name = it.key();
    const json& e = it.value();
    if (name == "__metadata__") {
      TP_CHECK(e.is_object(), "{}: __metadata__ must be an object of strings, got {}", file, e.type_name());
      for (auto m = e.begin(); m != e.end(); ++m) {
        TP_CHECK(m.value().is_string(), "{}: __metadata__['{}'] must be a string, got {}", file, m.key(),
                 m.value().dump());
        h.metadata[m.key()] = m.value().get<std::string>();
      }
      continue;
    }
    const std::string where = fmt::format("{}: tensor '{}'", file, name);
    TP_CHECK(e.is_object(), "{}: entry must be an object with dtype, shape, data_offsets; got {}", where,
             e.type_name());
    for (auto f = e.begin(); f != e.end(); ++f)
      TP_CHECK(f.key() == "dtype" || f.key() == "shape" || f.key() == "data_offsets",
               "{}: unexpected field '{}'; expected dtype, shape, data_offsets", where, f.key());
    auto dt = e.find("dtype"), sh = e.find("shape"), off = e.find("data_offsets");
    TP_CHECK(dt != e.end() && dt->is_string(), "{}: 'dtype' missing or not a string (accepted: {})", where, kAccepted);
    TP_CHECK(sh != e.end() && sh->is_array(), "{}: 'shape' missing or not a list of integers", where);
    TP_CHECK(off != e.end() && off->is_array() && off->size() == 2, "{}: 'data_offsets' must be [begin, end]", where);

    TensorInfo t;
    t.name = name;
    t.file = path;
    t.dtype = parse_st_dtype(dt->get<std::string>(), where);
    // numel in 128 bits would be exact; instead stop as soon as it exceeds the file.
    size_t elems = 1;
    for (const json& d : *sh) {
      size_t v = to_size(d, where, "every shape entry");
      TP_CHECK(v <= static_cast<size_t>(std::numeric_limits<int64_t>::max()), "{}: shape entry {} too large", where,
               v);
      t.shape.push_back(static_cast<int64_t>(v));
      if (v == 0) elems = 0;
      else if (elems != 0) {
        TP_CHECK(elems <= size / v, "{}: shape {} needs more bytes than the file holds ({} bytes)", where,
                 shape_str(t.shape), size);
        elems *= v;
      }
    }
    size_t begin = to_size((*off)[0], where, "data_offsets[0]");
    size_t end = to_size((*off)[1], where, "data_offsets[1]");
    TP_CHECK(begin <= end, "{}: data_offsets [{}, {}] has begin > end", where, begin, end);
    TP_CHECK(end <= h.data_size,
             "{}: data_offsets [{}, {}] lie outside the data area of {} bytes (file truncated or offsets wrong)", where,
             begin, end, h.data_size);
    // elems <= size here, so this product cannot overflow.
    size_t need = elems * dtype_size(t.dtype);
    TP_CHECK(need == end - begin, "{}: shape {} x {} needs {} bytes but data_offsets [{}, {}] span {} bytes", where,
             shape_str(t.shape), dt->get<std::string>(), need, begin, end, end - begin);
    t.data_begin = begin;
    t.nbytes = end - begin;
    h.tensors.push_back(std::move(t));
  }
  std::sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.data_begin != b.data_begin ? a.data_begin < b.data_begin : a.nbytes < b.nbytes;
  });
  // Sorted by begin, a tensor overlaps an earlier one iff it starts before the
  // furthest end seen so far (empty tensors occupy nothing).
  const TensorInfo* furthest = nullptr;
  for (const TensorInfo& b : h.tensors) {
    if (b.nbytes == 0) continue;
    if (furthest) {
      const TensorInfo& a = *furthest;
      TP_CHECK(a.data_begin + a.nbytes <= b.data_begin, "{}: tensors '{}' [{}, {}] and '{}' [{}, {}] overlap", file,
               a.name, a.data_begin, a.data_begin + a.nbytes, b.name, b.data_begin, b.data_begin + b.nbytes);
    }
    if (!furthest || b.data_begin + b.nbytes > furthest->data_begin + furthest->nbytes) furthest = &b;
  }
  return h;
}

}  // namespace tp::io
