// vocab_parallel_argmax must pick exactly what ops::sample_tokens' greedy (std::max_element)
// picks over the gathered row, for any split: generate relies on it at tp > 1.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>

#include "tp/distributed/process_group.h"
#include "tp/generation/sampling.h"
#include "tp/tensor/random.h"
#include "tp/tensor/tensor.h"

using namespace tp;

namespace {

// Every rank holds the full rows (the same on all); each takes its chunk and the
// result must equal the argmax of the whole row.
void expect_whole_row_argmax(const std::vector<std::vector<float>>& rows, const char* what) {
  dist::ProcessGroup& g = dist::world();
  const int64_t V = static_cast<int64_t>(rows[0].size()), B = static_cast<int64_t>(rows.size());
  const ChunkSpan span = chunk_span(V, g.size(), g.rank());
  std::vector<float> mine(static_cast<size_t>(B * span.size)), whole;
  for (int64_t b = 0; b < B; ++b) {
    std::copy(rows[b].begin() + span.offset, rows[b].begin() + span.offset + span.size, mine.begin() + b * span.size);
    whole.insert(whole.end(), rows[b].begin(), rows[b].end());
  }
  const std::vector<int64_t> got =
      generation::vocab_parallel_argmax(Tensor::from_vector(mine, {B, span.size}), span.offset, g);
  const std::vector<int64_t> want =
      ops::sample_tokens(Tensor::from_vector(whole, {B, V}), {}, std::vector<int64_t>(B, 0), std::vector<int64_t>(B, 0))
          .to_int_vector();
  for (int64_t b = 0; b < B; ++b) EXPECT_EQ(got[b], want[b]) << what << ", row " << b << ", " << g.size() << " ranks";
}

}  // namespace

TEST(VocabParallelArgmax, RandomRows) {
  std::vector<std::vector<float>> rows;
  for (uint64_t seed = 1; seed <= 4; ++seed) rows.push_back(Tensor::randn({1001}, seed).to_vector());
  expect_whole_row_argmax(rows, "random");
}

TEST(VocabParallelArgmax, TiesGoToTheLowestIdAcrossRanks) {
  // The maximum repeats in every rank's piece (and at piece boundaries): the first wins.
  std::vector<float> flat(12, 1.0f), two_peaks(12, 0.0f), last(12, -3.0f);
  two_peaks[5] = two_peaks[11] = 2.0f;
  last[11] = -1.0f;
  expect_whole_row_argmax({flat, two_peaks, last}, "ties");
}

TEST(VocabParallelArgmax, NansAndInfinitiesAsMaxElementTreatsThem) {
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  std::vector<float> first_nan(10, 0.5f), later_nans(10, 0.5f), all_minus_inf(10, -inf), plus_inf(10, 1.0f);
  first_nan[0] = nan;  // max_element keeps a leading NaN
  first_nan[7] = 9.0f;
  later_nans[3] = later_nans[6] = later_nans[9] = nan;  // skipped: a number is larger
  later_nans[8] = 4.0f;
  plus_inf[6] = inf;
  expect_whole_row_argmax({first_nan, later_nans, all_minus_inf, plus_inf}, "nan/inf");
}

TEST(VocabParallelArgmax, RanksWithoutLogitsAndTheFlag) {
  // Fewer ids than ranks: trailing ranks hold nothing of the row.
  expect_whole_row_argmax({{0.25f, 3.0f}, {7.0f, -1.0f}}, "2 ids");
  dist::ProcessGroup& g = dist::world();
  const ChunkSpan span = chunk_span(3, g.size(), g.rank());
  std::vector<float> row = {1.0f, 2.0f, 0.0f};
  int64_t flag = g.rank() == 0 ? 7 : 0;  // rank 0's value travels, the others' are ignored
  generation::vocab_parallel_argmax(
      Tensor::from_vector({row.begin() + span.offset, row.begin() + span.offset + span.size}, {1, span.size}),
      span.offset, g, &flag);
  EXPECT_EQ(flag, 7);
}
