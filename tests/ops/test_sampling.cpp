// ops::sample_tokens and the pieces of vocab-parallel greedy: greedy's ties and
// NaNs as std::max_element has them, the draw's frequencies, top-k / top-p, a
// row's draw independent of its batch, and bad options named.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>

#include "tp/core/error.h"
#include "tp/ops/sampling.h"

using namespace tp;

namespace {

std::vector<int64_t> sample(const std::vector<std::vector<float>>& rows, const ops::SamplingOptions& o,
                            int64_t step = 0) {
  std::vector<float> flat;
  for (const auto& r : rows) flat.insert(flat.end(), r.begin(), r.end());
  const int64_t B = static_cast<int64_t>(rows.size());
  std::vector<int64_t> streams(static_cast<size_t>(B));
  for (int64_t b = 0; b < B; ++b) streams[b] = b;
  return ops::sample_tokens(Tensor::from_vector(flat, {B, static_cast<int64_t>(rows[0].size())}), o, streams,
                            std::vector<int64_t>(static_cast<size_t>(B), step))
      .to_int_vector();
}

}  // namespace

TEST(Sampling, GreedyTakesTheFirstOfTheLargestAndKeepsALeadingNan) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  EXPECT_EQ(sample({{1, 3, 3, 2}, {nan, 5, 1, 0}, {0, nan, 4, 4}}, {}), (std::vector<int64_t>{1, 0, 2}));
}

TEST(Sampling, DrawsFollowTheSoftmaxAndTheSameStreamAndStepGiveTheSameToken) {
  // p = (1/4, 3/4): id 1 about three times in four over 4000 steps of one stream.
  const ops::SamplingOptions o{.temperature = 1.0, .seed = 11};
  int ones = 0;
  for (int64_t step = 0; step < 4000; ++step) ones += sample({{0.f, std::log(3.f)}}, o, step)[0] == 1;
  EXPECT_NEAR(ones / 4000.0, 0.75, 0.03);
  // Temperature 0.5 squares the odds: (1/10, 9/10).
  int sharp = 0;
  for (int64_t step = 0; step < 4000; ++step)
    sharp += sample({{0.f, std::log(3.f)}}, {.temperature = 0.5, .seed = 11}, step)[0] == 1;
  EXPECT_NEAR(sharp / 4000.0, 0.9, 0.03);
  EXPECT_EQ(sample({{0.f, 0.f, 0.f, 0.f}}, o, 7), sample({{0.f, 0.f, 0.f, 0.f}}, o, 7));
}

TEST(Sampling, ARowDrawsWhatItDrawsAloneWhateverTheBatch) {
  const ops::SamplingOptions o{.temperature = 0.8, .top_k = 50, .top_p = 0.9, .seed = 3};
  const std::vector<float> a = Tensor::randn({300}, 1).to_vector(), b = Tensor::randn({300}, 2).to_vector();
  for (int64_t step = 0; step < 20; ++step) {
    const std::vector<int64_t> both = sample({a, b}, o, step);
    const Tensor alone = ops::sample_tokens(Tensor::from_vector(b, {1, 300}), o, {1}, {step});
    EXPECT_EQ(both[1], alone.to_int_vector()[0]) << "step " << step;
  }
}

TEST(Sampling, TopKAndTopPKeepOnlyTheLeadingTokens) {
  const std::vector<float> row = {0.f, 2.f, 1.f, 3.f, -1.f};  // order by logit: 3, 1, 2, 0, 4
  for (int64_t step = 0; step < 200; ++step) {
    const int64_t k2 = sample({row}, {.temperature = 1.0, .top_k = 2, .seed = 5}, step)[0];
    EXPECT_TRUE(k2 == 3 || k2 == 1) << k2;
    // p(3) = e^3 / sum ~ 0.64: top_p 0.5 keeps id 3 alone.
    EXPECT_EQ(sample({row}, {.temperature = 1.0, .top_p = 0.5, .seed = 5}, step)[0], 3);
  }
  EXPECT_EQ(sample({row}, {.temperature = 1.0, .top_k = 1, .seed = 9}), sample({row}, {}));
}

TEST(Sampling, BadOptionsAreNamed) {
  auto message = [](const ops::SamplingOptions& o) {
    try {
      sample({{1.f, 2.f}}, o);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_EQ(message({.temperature = -1}), "temperature must be >= 0, got -1");
  EXPECT_EQ(message({.top_p = 0}), "top_p must be in (0, 1], got 0");
  EXPECT_EQ(message({.top_k = -2}), "top_k must be >= 0, got -2");
  EXPECT_THROW(ops::sample_tokens(Tensor::from_vector({1.f}, {1, 1}), {}, {0, 1}, {0}), Error);
  EXPECT_THROW(ops::sample_tokens(Tensor::from_ints({1}, {1, 1}), {}, {0}, {0}), Error);
}

TEST(VocabParallelPieces, CandidatesOfEachPieceMakeTheWholeRowsArgmax) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> row = {1.f, nan, 4.f, 4.f, 2.f, 4.f};  // whole-row argmax: 2
  // Pieces [0, 2), [2, 4), [4, 6) as three ranks would hold them.
  std::vector<int64_t> all;
  for (int64_t p = 0; p < 3; ++p) {
    const Tensor mine = Tensor::from_vector({row[2 * p], row[2 * p + 1]}, {1, 2});
    const std::vector<int64_t> c = ops::argmax_candidates(mine, 2 * p, p == 0).to_int_vector();
    all.insert(all.end(), c.begin(), c.end());
  }
  EXPECT_EQ(all[1], 0) << "the first piece's NaN is past its first element: max_element keeps 1.0";
  EXPECT_EQ(ops::best_candidates(Tensor::from_ints(all, {3, 1, 2})).to_int_vector(), (std::vector<int64_t>{2}));
  EXPECT_EQ(sample({row}, {}), (std::vector<int64_t>{2}));
}

TEST(Sampling, GreedyOnLongRowsIsMaxElementsAnswer) {
  // Greedy's scan is vectorized (16 lanes, a masked tail): rows of every length around the lane count and a real
  // vocabulary, with repeated maxima across lanes, NaNs, infinities and signed zeros, against std::max_element (and
  // a later piece against the same rule without a leading NaN).
  const float nan = std::numeric_limits<float>::quiet_NaN(), inf = std::numeric_limits<float>::infinity();
  uint64_t state = 12345;
  auto next = [&] { return (state = state * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  std::vector<int64_t> lengths = {1, 2, 15, 16, 17, 31, 32, 33, 47, 100, 151936};
  for (int round = 0; round < 40; ++round) lengths.push_back(1 + static_cast<int64_t>(next() % 300));
  for (int64_t n : lengths) {
    for (int form = 0; form < 7; ++form) {
      std::vector<float> row(static_cast<size_t>(n));
      for (float& v : row) v = static_cast<float>(next() % 1000) / 100.f - 5.f;
      const auto at = [&] { return static_cast<size_t>(next() % static_cast<uint64_t>(n)); };
      if (form == 1) row.assign(row.size(), 7.f);         // all tied: the first
      if (form == 2) row[at()] = 9.5f, row[at()] = 9.5f;  // the max twice, maybe in other lanes
      if (form == 3) row[at()] = nan, row[at()] = nan, row[at()] = inf;
      if (form == 4) row.assign(row.size(), -inf), row[at()] = nan;  // only -inf and a NaN
      if (form == 5) row.assign(row.size(), nan);                    // only NaNs
      if (form == 6) row.assign(row.size(), -1.f), row[at()] = -0.f, row[at()] = 0.f;
      const int64_t want = std::max_element(row.begin(), row.end()) - row.begin();
      EXPECT_EQ(sample({row}, {})[0], want) << "n " << n << " form " << form;
      const Tensor logits = Tensor::from_vector(row, {1, n});
      EXPECT_EQ(ops::argmax_candidates(logits, 100, true).to_int_vector()[1], 100 + want) << n << " " << form;
      int64_t later = -1;  // a later piece: NaNs never answer
      for (int64_t j = 0; j < n; ++j)
        if (!std::isnan(row[j]) && (later < 0 || row[later] < row[j])) later = j;
      EXPECT_EQ(ops::argmax_candidates(logits, 100, false).to_int_vector()[1], later < 0 ? -1 : 100 + later)
          << "n " << n << " form " << form;
    }
  }
}
