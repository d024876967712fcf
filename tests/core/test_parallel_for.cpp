#include <gtest/gtest.h>
#include <omp.h>

#include <atomic>
#include <vector>

#include "tp/core/parallel_for.h"

using namespace tp;

namespace {

// Sets the threads a region may use for one test, and puts the old count back.
class Threads {
 public:
  explicit Threads(int n) : old_(omp_get_max_threads()) { omp_set_num_threads(n); }
  ~Threads() { omp_set_num_threads(old_); }

 private:
  int old_;
};

}  // namespace

// Every index once, whether the loop is split over threads or not.
TEST(ParallelFor, EachIndexOnce) {
  for (int threads : {1, 2, 3}) {
    Threads t(threads);
    for (bool worth : {false, true}) {
      std::vector<std::atomic<int>> hits(1000);
      parallel_for(1000, worth, [&](int64_t i) { hits[i]++; });
      for (int i = 0; i < 1000; ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i << ", threads " << threads;
    }
  }
}

// On one thread (or for a loop too small to split) the body is called
// directly: no OpenMP region, whose end costs a system call.
TEST(ParallelFor, OneThreadEntersNoRegion) {
  {
    Threads t(1);
    parallel_for(4, true, [](int64_t) { EXPECT_EQ(omp_get_level(), 0); });
    parallel_region(true, [] { EXPECT_EQ(omp_get_level(), 0); });
  }
  Threads t(2);
  parallel_for(4, false, [](int64_t) { EXPECT_EQ(omp_get_level(), 0); });
  parallel_region(false, [] { EXPECT_EQ(omp_get_level(), 0); });
  // Worth splitting, with two threads: the threads share the loop.
  std::atomic<int> most{0};
  parallel_for(64, true, [&](int64_t) {
    EXPECT_EQ(omp_get_level(), 1);
    most = std::max(most.load(), omp_get_num_threads());
  });
  EXPECT_EQ(most.load(), 2);
}

// A region's `omp for` covers its loop once, on one thread or several.
TEST(ParallelRegion, SharedLoopEachIndexOnce) {
  for (int threads : {1, 2}) {
    Threads t(threads);
    for (bool worth : {false, true}) {
      std::vector<std::atomic<int>> hits(100);
      std::atomic<int> regions{0};
      parallel_region(worth, [&] {
        regions++;
        std::vector<int> scratch(8);  // per-thread scratch, as the kernels keep
#pragma omp for schedule(static)
        for (int64_t i = 0; i < 100; ++i) hits[i] += 1 + scratch[0];
      });
      EXPECT_EQ(regions.load(), worth && threads > 1 ? threads : 1);
      for (int i = 0; i < 100; ++i) ASSERT_EQ(hits[i].load(), 1) << "index " << i;
    }
  }
}

// Called by each thread of an enclosing region, a region's loop runs whole on
// each caller: its `omp for` must not split the loop over the enclosing team
// (which would leave each caller with part of its own loop).
TEST(ParallelRegion, InsideAnotherRegionEachCallerRunsItsWholeLoop) {
  Threads t(2);
  std::vector<std::atomic<int>> hits(50);
  std::atomic<int> callers{0};
#pragma omp parallel num_threads(2)
  {
    callers++;
    parallel_region(true, [&] {
#pragma omp for schedule(static)
      for (int64_t i = 0; i < 50; ++i) hits[i]++;
    });
  }
  ASSERT_EQ(callers.load(), 2);
  for (int i = 0; i < 50; ++i) ASSERT_EQ(hits[i].load(), 2) << "index " << i;
}
