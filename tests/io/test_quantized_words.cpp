// The quantized formats' int32 words (io/quantized_words.h): each layout packs
// values where its format's readers look for them, and unpacks them back.
#include <gtest/gtest.h>

#include <utility>

#include "tp/io/quantized_words.h"
#include "tp/io/round_to_nearest.h"

namespace tp {
namespace {

// Values [rows, cols] in 0 .. 2^bits - 1 from a fixed pattern.
Tensor pattern(int64_t rows, int64_t cols, int bits) {
  std::vector<int64_t> v(static_cast<size_t>(rows * cols));
  for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<int64_t>((i * 7 + 3) % (1u << bits));
  return Tensor::from_ints(v, {rows, cols}, DType::U8);
}

// Whole words, and (13 x 21) a last word along the packed dim that is partly empty.
TEST(QuantizedWords, EveryLayoutUnpacksWhatItPacks) {
  for (const auto [rows, cols] : {std::pair<int64_t, int64_t>{16, 24}, {13, 21}})
    for (int bits : {4, 8})
      for (int packed_dim : {0, 1})
        for (bool transposed : {false, true})
          for (bool awq : {false, true}) {
            if (awq && bits != 4) continue;
            const io::WordLayout layout{bits, packed_dim, transposed, awq};
            const Tensor values = pattern(rows, cols, bits);
            const Tensor words = io::pack_words(values, layout);
            const int64_t pf = 32 / bits, packed_rows = packed_dim == 0 ? (rows + pf - 1) / pf : rows,
                          packed_cols = packed_dim == 1 ? (cols + pf - 1) / pf : cols;
            EXPECT_EQ(words.shape(), transposed ? (Shape{packed_cols, packed_rows}) : (Shape{packed_rows, packed_cols}));
            EXPECT_EQ(io::unpack_words(words, layout, rows, cols).to_vector(), values.to_vector())
                << rows << " x " << cols << ", " << bits << " bits, packed along " << packed_dim
                << (transposed ? ", transposed" : "") << (awq ? ", AWQ order" : "");
          }
}

TEST(QuantizedWords, SlotsAreTheFormatsBitPositions) {
  // Values 0 .. 7 along a row, 4-bit: in order, value j at bits 4j; AWQ's order 0 2 4 6 1 3 5 7 by slot.
  const Tensor row = Tensor::from_ints({0, 1, 2, 3, 4, 5, 6, 7}, {1, 8}, DType::U8);
  EXPECT_EQ(io::pack_words(row, {4, 1, false, false}).to_int_vector(), std::vector<int64_t>{0x76543210});
  EXPECT_EQ(io::pack_words(row, {4, 1, false, true}).to_int_vector(), std::vector<int64_t>{0x75316420});
}

TEST(QuantizedWords, ZeroPointsAddGptqV1sOneAndCheckSym) {
  const io::WordLayout layout{4, 0, true, false};
  const Tensor stored = Tensor::full({8, 2}, 7, DType::U8);  // z - 1 for z = 8
  const Tensor words = io::pack_words(Tensor::full({8, 2}, 8, DType::U8), layout, 1);
  EXPECT_EQ(io::pack_words(stored, layout).to_int_vector(), words.to_int_vector());
  const Tensor z = io::unpack_zero_points(words, layout, 8, 1, true, {"f", "t"});
  EXPECT_EQ(z.to_vector(), std::vector<float>(16, 8.f));
  EXPECT_THROW(io::unpack_zero_points(words, layout, 8, 0, true, {"f", "t"}), Error);  // 7 is not sym's 8
}

TEST(QuantizedWords, RoundToNearestDequantizesWithinHalfAScale) {
  const Tensor w = Tensor::randn({4, 16}, 1);
  const std::vector<int32_t> group(16, 0);
  const io::RoundedWeight q = io::round_to_nearest({4, false, false, DType::F16}, w, group, 1, "m");
  const Tensor back = io::dequantize_codes(q.codes, q.scales, q.zeros, Tensor(), 16);
  const std::vector<float> a = w.to_vector(), b = back.to_vector(), s = q.scales.to_vector();
  for (size_t i = 0; i < a.size(); ++i) EXPECT_LE(std::abs(a[i] - b[i]), 0.5f * s[i / 16] * 1.0001f) << i;
}

}  // namespace
}  // namespace tp
