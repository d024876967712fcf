// Decode attention (one query token against a KV cache), the part of a decode
// step that reads the cache: qwen3-0.6b's shape per layer (16 query heads, 8 kv
// heads, head dim 128) over 28 layers' caches of `context` tokens, in one block as
// KVCache::for_layers lays out a model's, rotated so every call reads its keys
// and values from DRAM as a real step does (at 128 tokens the 28 caches, 29 MB in
// f32 and 15 in bf16, may stay in L3: the kernels' arithmetic more than the
// memory); f32 and bf16 caches. Counter: GB of K and V read per second (time per
// call is the figure to compare across dtypes: bf16 reads half the bytes).
//
// Decode attention's kernels alone (decode_kernels): the score pass (dots) or the
// value pass (axpys) of one layer over 64 positions, the same cache every call, so
// it stays in L1/L2: what the arithmetic allows without the memory. Counter: GB of
// that pass's K or V a second.
//
// Training attention (causal self-attention over a whole sequence, forward and
// backward, compute_dtype f32 and bf16): qwen3-0.6b's heads at B = 1, T = 512,
// next to the same run's plain GEMM rate (f32 and bf16 operands) for one
// [512 x 128] . [128 x 512] product (Q . K^T of one head) through detail::gemm,
// so the ratio to what the matmul reaches is visible. GFLOP counts
// the useful multiply-adds only: 4 B Hq D per causally visible (query, key) pair
// for the forward (S = Q K^T and O = P V), 2.5x that for the backward (S again,
// dP = dO V^T, dV, dK, dQ); masked work a kernel does anyway is not counted.
//
//   OMP_NUM_THREADS=1 build/bench/ops/bench_attention --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true
//   OMP_NUM_THREADS=1 build/bench/ops/bench_attention --benchmark_filter='training|gemm'
//   OMP_NUM_THREADS=1 build/bench/ops/bench_attention --benchmark_filter=decode_kernels
//
// The same decode step over a head-major cache (decode_head_major): each layer's
// keys and values as [Hkv, context, D], the layout Transformers' cache keeps
// ([B, H, T, D]), where KVCache keeps [context, Hkv, D]. The library's score and
// value kernels walk each kv head's rows as one run of memory, each 16-position
// block prefetching the next block of that run, with the same softmax between the
// passes. The library's attention does not read this layout: the case measures
// what reading it would give, against decode_attention in the same run. Before
// timing, its step on layer 0 must equal ops::attention over the same keys and
// values in KVCache's layout (within 1e-5 of the output's scale), or it errs.
//   OMP_NUM_THREADS=1 taskset -c 1 build/bench/ops/bench_attention
//       --benchmark_filter='decode_(attention|head_major)/context:(640|4096)/bf16:1'
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <vector>

#include "tp/autograd/tape.h"
#include "tp/ops/attention.h"
#include "tp/ops/gemm.h"
#include "tp/ops/shape.h"
#include "tp/ops/vec.h"

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

// range(0): 0 the score pass, 1 the value pass; range(1): 1 for a bf16 cache, 0 for f32. Each kv head's pass over
// the positions for its 2 query heads, as decode's rows path calls the kernels.
void BM_decode_kernels(benchmark::State& state) {
  const int64_t positions = 64, hq = 16, hkv = 8, d = 128, row = hkv * d, group = hq / hkv;
  const bool values = state.range(0) == 1, bf16_cache = state.range(1) == 1;
  const auto& vk = ops::detail::vec_kernels();
  Tensor cache = Tensor::randn({positions, row}, 7).to(bf16_cache ? DType::BF16 : DType::F32);
  std::vector<float> q = Tensor::randn({hq, d}, 8).to_vector(), o(static_cast<size_t>(hq * d));
  std::vector<float> p(static_cast<size_t>(hq * positions), 1.f / positions);
  for (auto _ : state) {
    for (int64_t kh = 0; kh < hkv; ++kh) {
      const int64_t h = kh * group;
      if (!values && bf16_cache)
        vk.dots_bf16(q.data() + h * d, group, cache.data<bf16>() + kh * d, row, positions, d, p.data() + h * positions,
                     positions);
      else if (!values)
        vk.dots(q.data() + h * d, group, cache.data<float>() + kh * d, row, positions, d, p.data() + h * positions,
                positions);
      else if (bf16_cache)
        vk.axpys_bf16(p.data() + h * positions, positions, group, cache.data<bf16>() + kh * d, row, positions, d,
                      o.data() + h * d);
      else
        vk.axpys(p.data() + h * positions, positions, group, cache.data<float>() + kh * d, row, positions, d,
                 o.data() + h * d);
    }
    benchmark::DoNotOptimize(p.data());
    benchmark::DoNotOptimize(o.data());
  }
  state.counters["GB"] =
      benchmark::Counter(static_cast<double>(cache.nbytes()), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["ns_per_position"] = benchmark::Counter(
      static_cast<double>(positions), benchmark::Counter::kIsIterationInvariantRate | benchmark::Counter::kInvert);
}

// range(0): tokens of context; a bf16 cache, qwen3-0.6b's 28 layers as in BM_decode_attention.
void BM_decode_head_major(benchmark::State& state) {
  const int64_t context = state.range(0), hq = 16, hkv = 8, d = 128, layers = 28, group = hq / hkv, block = 16;
  // Every layer's keys then values, [Hkv, context, D] each, in one block on huge pages as KVCache::for_layers' are.
  const int64_t per = hkv * context * d;
  Tensor cache = Tensor::randn({layers * 2 * per}, 5).to(DType::BF16);
  const bf16* base = cache.data<bf16>();
  const std::vector<float> q = Tensor::randn({hq, d}, 99).to_vector();
  std::vector<float> p(static_cast<size_t>(group * context)), o(static_cast<size_t>(hq * d));
  const auto& vk = ops::detail::vec_kernels();
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  // The next block of a run (16 positions of one kv head: 4 KiB), when there is one.
  auto prefetch_block = [&](const bf16* run, int64_t j) {
    if (j >= context) return;
    const char* at = reinterpret_cast<const char*>(run + j * d);
    const int64_t bytes = std::min(block, context - j) * d * static_cast<int64_t>(sizeof(bf16));
    for (int64_t b = 0; b < bytes; b += 64) __builtin_prefetch(at + b);
  };
  auto step = [&](int64_t l) {
    const bf16* keys = base + 2 * l * per;
    const bf16* values = keys + per;
    std::fill(o.begin(), o.end(), 0.f);
    for (int64_t kh = 0; kh < hkv; ++kh) {
      const bf16* k = keys + kh * context * d;
      const bf16* v = values + kh * context * d;
      for (int64_t j = 0; j < context; j += block) {
        prefetch_block(k, j + block);
        vk.dots_bf16(q.data() + kh * group * d, group, k + j * d, d, std::min(block, context - j), d, p.data() + j,
                     context);
      }
      for (int64_t r = 0; r < group; ++r) vk.softmax(p.data() + r * context, context, scale);
      for (int64_t j = 0; j < context; j += block) {
        prefetch_block(v, j + block);
        vk.axpys_bf16(p.data() + j, context, group, v + j * d, d, std::min(block, context - j), d,
                      o.data() + kh * group * d);
      }
    }
  };
  // The step must be the library's decode attention over the same keys and values: layer 0's, laid out as KVCache
  // keeps them ([1, context, Hkv, D]), through ops::attention.
  {
    autograd::NoGradGuard no_grad;
    auto position_major = [&](int64_t offset) {
      Tensor head_major = ops::reshape(cache.narrow(0, offset, per).to(DType::F32), {1, hkv, context, d});
      return ops::transpose(head_major, 1, 2).to(DType::BF16);
    };
    const Tensor expected =
        ops::attention(Tensor::from_vector(q, {1, 1, hq, d}), position_major(0), position_major(per));
    step(0);
    const std::vector<float> want = expected.to_vector();
    float worst = 0, largest = 0;
    for (size_t i = 0; i < o.size(); ++i) {
      worst = std::max(worst, std::abs(o[i] - want[i]));
      largest = std::max(largest, std::abs(want[i]));
    }
    if (worst > 1e-5f * largest) state.SkipWithError("the head-major step differs from ops::attention");
  }
  int64_t l = 0;
  for (auto _ : state) {
    step(l);
    benchmark::DoNotOptimize(o.data());
    l = (l + 1) % layers;
  }
  const double bytes = 2.0 * per * sizeof(bf16);
  state.counters["GB"] = benchmark::Counter(bytes * state.iterations() / 1e9, benchmark::Counter::kIsRate);
}

constexpr int64_t kT = 512, kHq = 16, kHkv = 8, kD = 128;

void set_attention_flops(benchmark::State& state, double multiple) {
  const double pairs = kT * (kT + 1) / 2.0;
  state.counters["GFLOP"] =
      benchmark::Counter(multiple * 4.0 * kHq * kD * pairs * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// range(0) of the training benchmarks: 1 for compute_dtype BF16, 0 for F32.
ops::AttentionOptions training_options(const benchmark::State& state) {
  ops::AttentionOptions opt;
  opt.compute_dtype = state.range(0) ? DType::BF16 : DType::F32;
  return opt;
}

void BM_training_attention_forward(benchmark::State& state) {
  autograd::NoGradGuard no_grad;
  const ops::AttentionOptions opt = training_options(state);
  Tensor q = Tensor::randn({1, kT, kHq, kD}, 1), k = Tensor::randn({1, kT, kHkv, kD}, 2),
         v = Tensor::randn({1, kT, kHkv, kD}, 3);
  for (auto _ : state) {
    Tensor out = ops::attention(q, k, v, opt);
    benchmark::DoNotOptimize(out.raw_data());
  }
  set_attention_flops(state, 1.0);
}

// Times autograd::backward of one recorded attention (the op's backward plus the
// engine's accumulation of three leaf gradients); the forward is outside the clock.
void BM_training_attention_backward(benchmark::State& state) {
  const ops::AttentionOptions opt = training_options(state);
  Tensor q = Tensor::randn({1, kT, kHq, kD}, 1).set_requires_grad(true),
         k = Tensor::randn({1, kT, kHkv, kD}, 2).set_requires_grad(true),
         v = Tensor::randn({1, kT, kHkv, kD}, 3).set_requires_grad(true);
  Tensor dout = Tensor::randn({1, kT, kHq, kD}, 4);
  for (auto _ : state) {
    Tensor out = ops::attention(q, k, v, opt);
    auto start = std::chrono::steady_clock::now();
    autograd::backward(out, dout);
    state.SetIterationTime(std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    q.zero_grad();
    k.zero_grad();
    v.zero_grad();
  }
  set_attention_flops(state, 2.5);
}

// ops::attention_backward alone: the op's own time, without the engine's copies
// of the gradients it hands to the leaves.
void BM_training_attention_backward_op(benchmark::State& state) {
  const ops::AttentionOptions opt = training_options(state);
  Tensor q = Tensor::randn({1, kT, kHq, kD}, 1), k = Tensor::randn({1, kT, kHkv, kD}, 2),
         v = Tensor::randn({1, kT, kHkv, kD}, 3), dout = Tensor::randn({1, kT, kHq, kD}, 4);
  for (auto _ : state) {
    ops::AttentionGrads grads = ops::attention_backward(q, k, v, dout, opt);
    benchmark::DoNotOptimize(grads.dq.raw_data());
  }
  set_attention_flops(state, 2.5);
}

// range(0): 1 for bf16 operands, 0 for f32.
void BM_gemm(benchmark::State& state) {
  const DType dtype = state.range(0) ? DType::BF16 : DType::F32;
  Tensor a = Tensor::randn({kT, kD}, 1, 0.f, 1.f, dtype), b = Tensor::randn({kT, kD}, 2, 0.f, 1.f, dtype);
  Tensor c = Tensor::empty({kT, kT});
  const ops::detail::GemmSpec spec{kT, kT, kD, false, true, dtype, dtype};
  for (auto _ : state) {
    ops::detail::gemm(spec, a.raw_data(), b.raw_data(), nullptr, c.data<float>());
    benchmark::DoNotOptimize(c.raw_data());
  }
  state.counters["GFLOP"] =
      benchmark::Counter(2.0 * kT * kT * kD * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

BENCHMARK(BM_training_attention_forward)->Arg(0)->Arg(1)->ArgName("bf16")->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_training_attention_backward)->Arg(0)->Arg(1)->ArgName("bf16")->UseManualTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_training_attention_backward_op)->Arg(0)->Arg(1)->ArgName("bf16")->UseRealTime()->Unit(benchmark::kMillisecond);
BENCHMARK(BM_gemm)->Arg(0)->Arg(1)->ArgName("bf16")->UseRealTime()->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_kernels)
    ->ArgsProduct({{0, 1}, {0, 1}})
    ->ArgNames({"values", "bf16"})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_attention)
    ->ArgsProduct({{128, 640, 4096}, {0, 1}})
    ->ArgNames({"context", "bf16"})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK(BM_decode_head_major)
    ->ArgsProduct({{128, 640, 4096}, {1}})
    ->ArgNames({"context", "bf16"})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);
BENCHMARK_MAIN();
