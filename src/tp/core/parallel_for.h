#pragma once
// Loops over OpenMP's threads that cost nothing when they run on one thread.
//
// Entering an OpenMP region costs a futex system call when the region ends,
// even on a team of one thread or with a false `if` clause: 1.2 us a region on
// this machine's virtual CPUs (0.001 us for the same loop called directly). A
// decode token enters ~20 regions a layer, ~0.7 ms a token at tp=2, where each
// rank runs one thread. So a region is entered only when it can use a second
// thread, and otherwise the body is called directly.
#include <omp.h>

#include <cstdint>

namespace tp {

// Whether a loop that is `worth_threads` (large enough) can use more than one
// thread here: not on a one-thread rank, nor inside another region (whose
// nested regions get one thread).
inline bool use_threads(bool worth_threads) {
  return worth_threads && omp_get_max_threads() > 1 && !omp_in_parallel();
}

// body(i) for i in [0, n), split statically over the threads when use_threads.
template <class Body>
void parallel_for(int64_t n, bool worth_threads, Body&& body) {
  if (use_threads(worth_threads)) {
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < n; ++i) body(i);
  } else {
    for (int64_t i = 0; i < n; ++i) body(i);
  }
}

// region() once per thread when use_threads, else once on this thread. A
// region sets up per-thread scratch and shares its loop with `#pragma omp for`,
// which on one thread (outside any region) runs the whole loop. Called from
// inside another region's threads, it opens a team of its own (one thread), so
// that its `omp for` does not share the loop with the enclosing team.
template <class Region>
void parallel_region(bool worth_threads, Region&& region) {
  if (use_threads(worth_threads)) {
#pragma omp parallel
    region();
  } else if (omp_in_parallel()) {
#pragma omp parallel num_threads(1)
    region();
  } else {
    region();
  }
}

}  // namespace tp
