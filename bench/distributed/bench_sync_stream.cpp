// What tp = N could make of a decode token on this machine if its products were plain read passes: the ceiling that
// tp = 2 / tp = 1 of a bandwidth-bound decode meets here, with tp's collectives and none of its arithmetic.
//
// A token is `segments` pieces of `--mb` MB (a decoder's layers: weights and the KV cache they read) and a last
// piece of `--head-mb` (lm_head). Each rank streams its 1/N of every piece from its own buffer (huge pages, larger
// than the caches) and, after each, all-reduces a 4 KiB hidden state through tp's process group, as decode does
// after every row-parallel product; after the head, an all-gather of one (logit, id) pair a rank, as greedy on
// sharded logits does. The same tokens are timed again without the collectives (the ranks meet once a token): the
// memory bus alone. The defaults are qwen3-0.6b at int4 g128 with its head, 512 tokens into the cache: 234 MB of
// layer weights and 62 MB of KV cache in 56 pieces (2 all-reduces a layer), lm_head's 78 MB.
//
//   build/bench/distributed/bench_sync_stream                      (tp = 1; pin it: taskset -c 1)
//   build/src/tprun --nproc-per-node 2 build/bench/distributed/bench_sync_stream
//   [--mb 296] [--segments 56] [--head-mb 78] [--tokens 48] [--reps 3]
// Rank 0 prints one JSON line: the median over reps of tokens/s with and without the collectives, the read rate
// of one rank, and the collectives' share of a synced token.
#include <immintrin.h>
#include <sys/mman.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench_util.h"
#include "tp/distributed/process_group.h"
#include "tp/tensor/tensor.h"

namespace {

using tp::bench::Clock;
using tp::bench::median;
using tp::bench::seconds;

// 4 loads and 4 adds a 128-byte step (AVX2, so that any x86-64-v3 core runs it); the sum keeps the loads. noipa:
// GCC would find it pure and skip the passes of a token that repeat the last one's (seen: a 25% faster "read").
__attribute__((noipa)) int read_pass(const uint8_t* w, size_t bytes) {
  __m256i a0 = _mm256_setzero_si256(), a1 = a0, a2 = a0, a3 = a0;
  for (size_t i = 0; i < bytes; i += 128) {
    a0 = _mm256_add_epi32(a0, _mm256_load_si256(reinterpret_cast<const __m256i*>(w + i)));
    a1 = _mm256_add_epi32(a1, _mm256_load_si256(reinterpret_cast<const __m256i*>(w + i + 32)));
    a2 = _mm256_add_epi32(a2, _mm256_load_si256(reinterpret_cast<const __m256i*>(w + i + 64)));
    a3 = _mm256_add_epi32(a3, _mm256_load_si256(reinterpret_cast<const __m256i*>(w + i + 96)));
  }
  const __m256i s = _mm256_add_epi32(_mm256_add_epi32(a0, a1), _mm256_add_epi32(a2, a3));
  return _mm256_extract_epi32(s, 0) ^ _mm256_extract_epi32(s, 7);
}

size_t round_up(size_t bytes, size_t to) { return (bytes + to - 1) / to * to; }

}  // namespace

int main(int argc, char** argv) {
  tp::dist::init(&argc, &argv);
  double mb = 296, head_mb = 78;
  int segments = 56, tokens = 48, reps = 3;
  CLI::App app{"tp = N's ceiling for a bandwidth-bound decode token: read passes and tp's collectives"};
  app.add_option("--mb", mb, "MB of a token's layers (weights and KV cache), all ranks together")
      ->check(CLI::PositiveNumber);
  app.add_option("--head-mb", head_mb, "MB of lm_head, read last")->check(CLI::NonNegativeNumber);
  app.add_option("--segments", segments, "pieces of the layers' bytes, an all-reduce after each")
      ->check(CLI::PositiveNumber);
  app.add_option("--tokens", tokens, "tokens a timing")->check(CLI::PositiveNumber);
  app.add_option("--reps", reps, "timings of each form, alternating")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  tp::dist::ProcessGroup& group = tp::dist::world();
  const int ranks = group.size();
  // This rank's share of a piece and of the head, whole 128-byte steps.
  const size_t piece = round_up(static_cast<size_t>(mb * 1e6 / segments / ranks), 128);
  const size_t head = round_up(static_cast<size_t>(head_mb * 1e6 / ranks), 128);
  const size_t total = piece * segments + head;
  const size_t huge = size_t{2} << 20;
  auto* w = static_cast<uint8_t*>(std::aligned_alloc(huge, round_up(total, huge)));
  madvise(w, round_up(total, huge), MADV_HUGEPAGE);
  const int rank = group.rank();
  for (size_t i = 0; i < total; ++i) w[i] = static_cast<uint8_t>(i * 131 + rank);

  tp::Tensor hidden = tp::Tensor::full({1024}, 1.f);  // a decode step's hidden state in f32: 4 KiB
  tp::Tensor pick = tp::Tensor::from_ints({0, group.rank()}, {2}, tp::DType::I64);
  int sink = 0;
  auto token = [&](bool synced) {
    for (int s = 0; s < segments; ++s) {
      sink ^= read_pass(w + static_cast<size_t>(s) * piece, piece);
      if (synced) group.all_reduce(hidden);
    }
    sink ^= read_pass(w + static_cast<size_t>(segments) * piece, head);
    if (synced) sink ^= static_cast<int>(group.all_gather(pick, 0).numel());
  };
  // Tokens/s of `tokens` tokens on every rank, timed from a barrier to a barrier.
  auto rate = [&](bool synced) {
    group.barrier();
    const double c0 = group.collective_seconds();
    const Clock::time_point t = Clock::now();
    for (int i = 0; i < tokens; ++i) token(synced);
    group.barrier();
    const double s = seconds(t);
    return std::pair{tokens / s, (group.collective_seconds() - c0) / s};
  };
  token(true);  // warm the pages and the transport
  std::vector<double> synced, unsynced, collective_share;
  for (int r = 0; r < reps; ++r) {  // alternating, so that both see the same minutes of the bus
    const auto [with, share] = rate(true);
    synced.push_back(with);
    collective_share.push_back(share);
    unsynced.push_back(rate(false).first);
  }
  if (group.rank() == 0) {
    const double bytes_rank = static_cast<double>(total);
    nlohmann::json j = {{"ranks", ranks},
                        {"segments", segments},
                        {"bytes_per_token_rank0", bytes_rank},
                        {"tokens_per_s_synced", median(synced)},
                        {"tokens_per_s_unsynced", median(unsynced)},
                        {"read_gbs_rank0_synced", median(synced) * bytes_rank / 1e9},
                        {"read_gbs_rank0_unsynced", median(unsynced) * bytes_rank / 1e9},
                        {"collective_share_synced", median(collective_share)},
                        {"sink", sink & 1}};
    std::printf("%s\n", j.dump().c_str());
  }
  std::free(w);
  return 0;
}
