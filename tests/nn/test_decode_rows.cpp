// nn::DecodeRows: the innermost scope's flags reach a layer only where its input has as many rows; an empty scope
// hides the outer one (ep_dispatch_experts, whose rows are other ranks' tokens); scopes end with their block.
#include <gtest/gtest.h>

#include "tp/nn/decode_rows.h"

using tp::nn::DecodeRows;

TEST(DecodeRows, FlagsReachOnlyInputsOfTheirRowCount) {
  EXPECT_TRUE(DecodeRows::for_rows(3).empty());  // no scope: the count decides
  {
    const DecodeRows step({1, 0, 1});
    ASSERT_EQ(DecodeRows::for_rows(3).size(), 3u);
    EXPECT_EQ(DecodeRows::for_rows(3)[1], 0);
    EXPECT_TRUE(DecodeRows::for_rows(2).empty());  // another tensor's rows (a vision tower, a gathered shard)
    {
      const DecodeRows logits({1, 1});  // lm_head's picked rows
      EXPECT_EQ(DecodeRows::for_rows(2).size(), 2u);
      EXPECT_TRUE(DecodeRows::for_rows(3).empty());
    }
    {
      const DecodeRows foreign({});  // other ranks' tokens
      EXPECT_TRUE(DecodeRows::for_rows(3).empty());
      EXPECT_TRUE(DecodeRows::for_rows(0).empty());
    }
    EXPECT_EQ(DecodeRows::for_rows(3).size(), 3u);  // the outer scope again
  }
  EXPECT_TRUE(DecodeRows::for_rows(3).empty());
}
