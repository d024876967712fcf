#pragma once
// How many of the machine's cores other processes keep busy right now. Both
// front ends size their threads from it: tprun the ranks' OMP_NUM_THREADS, and
// `tp` started without a launcher its own threads.
#include <unistd.h>

#include <algorithm>
#include <cstdio>

namespace tp {

// Whole cores that other processes keep busy: /proc/stat's busy time over
// 50 ms (tprun itself sleeps through it), rounded down, so a core half used by a
// short-lived process does not count. 0 where /proc/stat cannot be read.
inline int busy_cores(int cores) {
  auto sample = [](long long& busy, long long& total) {
    std::FILE* f = std::fopen("/proc/stat", "r");
    if (!f) return false;
    long long v[8] = {};
    const int n = std::fscanf(f, "cpu %lld %lld %lld %lld %lld %lld %lld %lld", &v[0], &v[1], &v[2], &v[3], &v[4],
                              &v[5], &v[6], &v[7]);
    std::fclose(f);
    if (n < 5) return false;
    total = 0;
    for (long long x : v) total += x;
    busy = total - v[3] - v[4];  // all but idle and iowait
    return true;
  };
  long long b0 = 0, t0 = 0, b1 = 0, t1 = 0;
  if (!sample(b0, t0)) return 0;
  usleep(50 * 1000);
  if (!sample(b1, t1) || t1 <= t0) return 0;
  // /proc/stat counts every online CPU; tprun may be limited to `cores` of them.
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  const double busy = static_cast<double>(b1 - b0) / static_cast<double>(t1 - t0) * static_cast<double>(online);
  return std::clamp(static_cast<int>(busy + 0.25), 0, cores);  // 0.75 of a core counts as busy
}

}  // namespace tp
