#include "tp/io/quantized_words.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace tp::io {

namespace {

// AutoAWQ's WQLinear_GEMM puts column order[i] of each 8 at bit slot i, order = 0 2 4 6 1 3 5 7;
// column j therefore sits at slot kAwqSlot[j].
constexpr int kAwqSlot[8] = {0, 4, 1, 5, 2, 6, 3, 7};

// Little-endian int32 word i of bytes that may be unaligned (a view of the file's mapping).
uint32_t word(const char* bytes, int64_t i) {
  uint32_t w;
  std::memcpy(&w, bytes + i * 4, 4);
  return w;
}
uint32_t word(const Tensor& t, int64_t i) { return word(static_cast<const char*>(t.raw_data()), i); }

// Where value [r, c] of V sits: its word's index in the stored words and its bit shift.
struct WordAt {
  const WordLayout& l;
  int64_t stored_cols;  // the words tensor's dim 1

  int64_t index(int64_t r, int64_t c) const {
    const int pf = l.per_word();
    const int64_t pr = l.packed_dim == 0 ? r / pf : r, pc = l.packed_dim == 1 ? c / pf : c;
    return l.transposed ? pc * stored_cols + pr : pr * stored_cols + pc;
  }
  int shift(int64_t r, int64_t c) const {
    const int j = static_cast<int>((l.packed_dim == 0 ? r : c) % l.per_word());
    return l.bits * (l.awq_order ? kAwqSlot[j] : j);
  }
};

void check_words(const Tensor& words, const char* what) {
  TP_CHECK(words.dim() == 2 && dtype_size(words.dtype()) == 4, "{}: int32 words [rows, cols] expected, got {} {}",
           what, dtype_name(words.dtype()), shape_str(words.shape()));
}

}  // namespace

// Word by word: each word is read once and its per_word values written out. (Value by value, with a word's
// index and shift computed for each, unpacking took more time at load than reading the file.)
Tensor unpack_words(const Tensor& words, const WordLayout& layout, int64_t rows, int64_t cols) {
  check_words(words, "unpack_words");
  const WordAt at{layout, words.size(1)};
  const int pf = layout.per_word();
  const uint32_t mask = (1u << layout.bits) - 1;
  const bool along_rows = layout.packed_dim == 0;
  int shift[8] = {};
  for (int j = 0; j < pf; ++j) shift[j] = at.shift(along_rows ? j : 0, along_rows ? 0 : j);
  const int64_t packed_rows = along_rows ? (rows + pf - 1) / pf : rows;
  const int64_t packed_cols = along_rows ? cols : (cols + pf - 1) / pf;
  const char* stored = static_cast<const char*>(words.raw_data());
  Tensor out = Tensor::empty({rows, cols}, DType::U8);
  uint8_t* v = out.data<uint8_t>();
  // The word of packed position (pr, pc): its values go down a column (along rows) or along a row.
  const auto unpack = [&](int64_t pr, int64_t pc) {
    const int64_t r = along_rows ? pr * pf : pr, c = along_rows ? pc : pc * pf;
    const uint32_t w = word(stored, at.index(r, c));
    const int64_t count = std::min<int64_t>(pf, along_rows ? rows - r : cols - c);
    const int64_t step = along_rows ? cols : 1;
    for (int64_t j = 0; j < count; ++j) v[(r * cols + c) + j * step] = static_cast<uint8_t>((w >> shift[j]) & mask);
  };
  // The stored words in their memory order.
  if (layout.transposed) {
    for (int64_t pc = 0; pc < packed_cols; ++pc)
      for (int64_t pr = 0; pr < packed_rows; ++pr) unpack(pr, pc);
  } else {
    for (int64_t pr = 0; pr < packed_rows; ++pr)
      for (int64_t pc = 0; pc < packed_cols; ++pc) unpack(pr, pc);
  }
  return out;
}

Tensor unpack_zero_points(const Tensor& words, const WordLayout& layout, int64_t rows, int add, bool sym,
                          const Source& source) {
  check_words(words, "unpack_zero_points");
  const WordAt at{layout, words.size(1)};
  const int64_t groups = words.size(layout.transposed ? 0 : 1);
  const int mask = (1 << layout.bits) - 1;
  Tensor out = Tensor::empty({rows, groups}, DType::U8);
  uint8_t* z = out.data<uint8_t>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t g = 0; g < groups; ++g) {
      const int v = static_cast<int>((word(words, at.index(r, g)) >> at.shift(r, g)) & mask) + add;
      TP_CHECK(v <= 255, "{}: tensor '{}' stores {} (zero point minus one, checkpoint_format \"gptq\") for group "
               "{} of row {}: zero point {} does not fit {} bits", source.file, source.tensor, v - add, g, r, v,
               layout.bits);
      if (sym)
        TP_CHECK(v == 1 << (layout.bits - 1), "{}: tensor '{}' gives zero point {} for group {} of row {}, but "
                 "quantization_config says sym (zero point {})", source.file, source.tensor, v, g, r,
                 1 << (layout.bits - 1));
      z[r * groups + g] = static_cast<uint8_t>(v);
    }
  return out;
}

Tensor pack_words(const Tensor& values, const WordLayout& layout, int minus) {
  TP_CHECK(values.dim() == 2 && values.dtype() == DType::U8, "pack_words: u8 values [rows, cols] expected, got {} {}",
           dtype_name(values.dtype()), shape_str(values.shape()));
  const int64_t rows = values.size(0), cols = values.size(1), pf = layout.per_word();
  const int64_t packed_rows = layout.packed_dim == 0 ? (rows + pf - 1) / pf : rows;
  const int64_t packed_cols = layout.packed_dim == 1 ? (cols + pf - 1) / pf : cols;
  Tensor words = Tensor::zeros(layout.transposed ? Shape{packed_cols, packed_rows} : Shape{packed_rows, packed_cols},
                               DType::I32);
  const WordAt at{layout, words.size(1)};
  const uint8_t* v = values.data<uint8_t>();
  int32_t* w = words.data<int32_t>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) {
      const int64_t i = at.index(r, c);
      const auto value = static_cast<uint32_t>(v[r * cols + c] - minus);
      w[i] = static_cast<int32_t>(static_cast<uint32_t>(w[i]) | (value << at.shift(r, c)));
    }
  return words;
}

Tensor scale_rows(const Tensor& s, bool transposed, const Source& source) {
  TP_CHECK(s.dim() == 2 && s.dtype() == DType::F32, "scale_rows: f32 scales [rows, cols] expected, got {} {}",
           dtype_name(s.dtype()), shape_str(s.shape()));
  const int64_t rows = s.size(0), cols = s.size(1);
  const float* src = s.data<float>();
  for (int64_t i = 0; i < rows * cols; ++i)
    TP_CHECK(std::isfinite(src[i]), "{}: tensor '{}' holds {} at [{}, {}] (of the rows and columns this rank "
             "reads); scales must be finite", source.file, source.tensor, src[i], i / cols, i % cols);
  if (!transposed) return s;
  Tensor out = Tensor::empty({cols, rows});
  float* dst = out.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[c * rows + r] = src[r * cols + c];
  return out;
}

Tensor group_index(const Tensor& g, const std::vector<ChunkSpan>& spans, int64_t in_features, int64_t groups,
                   int64_t group_size, bool desc_act, const Source& source) {
  int64_t k = 0;
  for (const ChunkSpan& s : spans) k += s.size;
  TP_CHECK(g.numel() >= k && dtype_size(g.dtype()) == 4, "{}: tensor '{}' must hold {} int32 group indices, got {} {}",
           source.file, source.tensor, k, dtype_name(g.dtype()), shape_str(g.shape()));
  Tensor out = Tensor::empty({k}, DType::I32);
  int32_t* dst = out.data<int32_t>();
  int64_t i = 0;
  for (const ChunkSpan& s : spans)
    for (int64_t kk = s.offset; kk < s.offset + s.size; ++kk, ++i) {
      const auto v = static_cast<int32_t>(word(g, i));
      TP_CHECK(v >= 0 && v < groups, "{}: tensor '{}' holds {} at [{}]; group indices must lie in [0, {}) ({} groups "
               "of {} over in_features {})", source.file, source.tensor, v, kk, groups, groups, group_size,
               in_features);
      const int64_t natural = group_size == -1 ? 0 : kk / group_size;
      TP_CHECK(desc_act || v == natural, "{}: tensor '{}' holds {} at [{}] where k / group_size is {}, but "
               "quantization_config says desc_act false; an act-order checkpoint says \"desc_act\": true",
               source.file, source.tensor, v, kk, natural);
      dst[i] = v;
    }
  return out;
}

std::vector<int64_t> stored_ints(const Tensor& t) {
  TP_CHECK(t.dtype() == DType::I64 || dtype_size(t.dtype()) == 4, "stored_ints: i64 or i32 expected, got {}",
           dtype_name(t.dtype()));
  std::vector<int64_t> v(static_cast<size_t>(t.numel()));
  for (int64_t i = 0; i < t.numel(); ++i)
    v[i] = t.dtype() == DType::I64 ? t.data<int64_t>()[i] : static_cast<int32_t>(word(t, i));
  return v;
}

Tensor dequantize_codes(const Tensor& codes, const Tensor& scales, const Tensor& zeros, const Tensor& g_idx,
                        int64_t group_size) {
  TP_CHECK(codes.dim() == 2 && codes.dtype() == DType::U8 && scales.dtype() == DType::F32 &&
               zeros.dtype() == DType::U8 && scales.dim() == 2 && zeros.shape() == scales.shape() &&
               scales.size(0) == codes.size(0),
           "dequantize: codes u8 [n, k], scales f32 and zeros u8 [n, groups] expected, got {} {}, {} {}, {} {}",
           dtype_name(codes.dtype()), shape_str(codes.shape()), dtype_name(scales.dtype()),
           shape_str(scales.shape()), dtype_name(zeros.dtype()), shape_str(zeros.shape()));
  const int64_t n = codes.size(0), k = codes.size(1), groups = scales.size(1);
  TP_CHECK(g_idx.defined() || group_size > 0, "dequantize: group_size {} without g_idx", group_size);
  const uint8_t* c = codes.data<uint8_t>();
  const uint8_t* z = zeros.data<uint8_t>();
  const float* sc = scales.data<float>();
  const int32_t* gi = g_idx.defined() ? g_idx.data<int32_t>() : nullptr;
  Tensor out = Tensor::empty({n, k});
  float* o = out.data<float>();
  for (int64_t i = 0; i < k; ++i) {
    const int64_t g = gi ? gi[i] : i / group_size;
    TP_CHECK(g >= 0 && g < groups, "dequantize: column {} is in group {}, outside the {} held", i, g, groups);
  }
  for (int64_t r = 0; r < n; ++r)
    for (int64_t i = 0; i < k; ++i) {
      const int64_t g = gi ? gi[i] : i / group_size;
      o[r * k + i] = sc[r * groups + g] * static_cast<float>(static_cast<int>(c[r * k + i]) - z[r * groups + g]);
    }
  return out;
}

}  // namespace tp::io
