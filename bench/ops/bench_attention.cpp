// Decode attention (one query token against a KV cache), the part of a decode
// step that reads the cache: qwen3-0.6b's shape per layer (16 query heads, 8 kv
// heads, head dim 128) over 28 layers' caches of `context` tokens, in one block as
// KVCache::for_layers lays out a model's, rotated so every call reads its keys
// and values from DRAM as a real step does; f32 and bf16 caches. Counter: GB of
// K and V read per second (time per call is the figure to compare across
// dtypes: bf16 reads half the bytes).
//
//   OMP_NUM_THREADS=1 build/bench/ops/bench_attention --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true
#include <benchmark/benchmark.h>

#include <vector>

#include "tp/autograd/tape.h"
#include "tp/ops/attention.h"

using namespace tp;

namespace {

// range(0): tokens of context; range(1): 1 for a bf16 cache, 0 for f32.
void BM_decode_attention(benchmark::State& state) {
  const int64_t context = state.range(0), hq = 16, hkv = 8, d = 128, layers = 28;
  const DType dtype = state.range(1) ? DType::BF16 : DType::F32;
  autograd::NoGradGuard no_grad;
  // Laid out as a model's caches are: all layers in one block (on huge pages).
  std::vector<ops::KVCache> caches =
      ops::KVCache::for_layers(1, context, d, std::vector<ops::KVCache::Layer>(layers, {hkv, dtype}));
  for (int64_t l = 0; l < layers; ++l)
    caches[l].append(Tensor::randn({1, context, hkv, d}, 2 * l + 1), Tensor::randn({1, context, hkv, d}, 2 * l + 2));
  Tensor q = Tensor::randn({1, 1, hq, d}, 99);
  int64_t l = 0;
  for (auto _ : state) {
    Tensor out = ops::attention(q, caches[l].keys(), caches[l].values());
    benchmark::DoNotOptimize(out.raw_data());
    l = (l + 1) % layers;
  }
  const double bytes = 2.0 * context * hkv * d * dtype_size(dtype);
  state.counters["GB"] = benchmark::Counter(bytes * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

}  // namespace

BENCHMARK(BM_decode_attention)
    ->ArgsProduct({{640, 4096}, {0, 1}})
    ->ArgNames({"context", "bf16"})
    ->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
