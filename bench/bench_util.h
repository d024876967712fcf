#pragma once
// Small helpers the end-to-end benchmarks share: wall time, medians, peak memory.
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <fstream>
#include <string>
#include <vector>

namespace tp::bench {

using Clock = std::chrono::steady_clock;

inline double seconds(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

inline double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

inline int64_t peak_rss() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<int64_t>(u.ru_maxrss) * 1024;
}

// Resident set now (/proc/self/statm's second field, in pages).
inline int64_t current_rss() {
  std::ifstream statm("/proc/self/statm");
  int64_t pages = 0, resident = 0;
  statm >> pages >> resident;
  return resident * static_cast<int64_t>(sysconf(_SC_PAGESIZE));
}

// The resident set's high-water mark since the process started or since the
// last reset_peak_rss() (/proc/self/status's VmHWM), -1 where it cannot be read.
inline int64_t peak_rss_since_reset() {
  std::ifstream status("/proc/self/status");
  for (std::string key; status >> key;) {
    if (key == "VmHWM:") {
      int64_t kib = -1;
      status >> kib;
      return kib * 1024;
    }
    status.ignore(1 << 20, '\n');
  }
  return -1;
}

// Starts the high-water mark afresh from the resident set now (Linux: "5" to
// /proc/self/clear_refs), so that a phase's peak can be told from loading's.
inline bool reset_peak_rss() {
  std::ofstream refs("/proc/self/clear_refs");
  refs << "5";
  refs.flush();
  return static_cast<bool>(refs);
}

// The end-to-end benchmarks' prompt of n tokens: token i = (i * 7919 + 13) % vocab (torch_inference.py's too).
inline std::vector<int64_t> synthetic_prompt(int64_t n, int64_t vocab) {
  std::vector<int64_t> prompt(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) prompt[static_cast<size_t>(i)] = (i * 7919 + 13) % vocab;
  return prompt;
}

}  // namespace tp::bench
