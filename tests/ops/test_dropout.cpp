// Dropout masks drawn by position: a window of the matrix draws what the whole
// matrix draws there, the kept values are 1 / (1 - p), about p of them dropped.
#include <gtest/gtest.h>

#include "tp/ops/dropout.h"

namespace tp {
namespace {

TEST(DropoutMask, AWindowIsTheSliceOfTheWholeMask) {
  const double p = 0.25;
  const uint64_t stream = 1234;
  const Tensor whole = ops::dropout_mask({2, 8, 64}, p, stream, {.first_row = 0, .first_col = 0, .full_cols = 64});
  // Rows 3..10 of the 16, columns 16..47 of the 64 (one rank's rows and input columns).
  const Tensor part = ops::dropout_mask({8, 32}, p, stream, {.first_row = 3, .first_col = 16, .full_cols = 64});
  const std::vector<float> w = whole.to_vector(), q = part.to_vector();
  for (int64_t i = 0; i < 8; ++i)
    for (int64_t j = 0; j < 32; ++j) ASSERT_EQ(q[i * 32 + j], w[(3 + i) * 64 + 16 + j]) << i << "," << j;
  int64_t dropped = 0;
  for (float v : w) {
    ASSERT_TRUE(v == 0.f || v == static_cast<float>(1 / (1 - p))) << v;
    dropped += v == 0.f;
  }
  EXPECT_NEAR(static_cast<double>(dropped) / static_cast<double>(w.size()), p, 0.05);
  // Another stream, another mask.
  EXPECT_NE(ops::dropout_mask({2, 8, 64}, p, stream + 1, {.full_cols = 64}).to_vector(), w);
  EXPECT_THROW(ops::dropout_mask({4}, 1.0, stream, {.full_cols = 4}), Error);
}

}  // namespace
}  // namespace tp
