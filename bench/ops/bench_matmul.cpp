// Linear-layer throughput: ours (ops::linear through a PackedLinear) against raw
// oneDNN (a matmul primitive with pre-packed weights, everything created once) in
// the same run, f32 and bf16 weights; and quantized weights (ops::QuantizedLinear:
// 8-bit and 4-bit codes in groups of 128; prefill shapes in f32 and, suffix _bf16, in
// a bf16 model's arithmetic; 8 and 16 rows also as a server's decode steps, suffix
// /decode_steps), whose GB counter counts the bytes held (codes, scales and zeros); and GPT-OSS's expert shapes
// at decode in MXFP4 against 4-bit codes (BM_tp_quantized_*_expert).
//
//   OMP_NUM_THREADS=1 ./build/bench/ops/bench_matmul --benchmark_repetitions=5
//       --benchmark_report_aggregates_only=true      (one line)
//
// Counters are rates: GFLOP (shown as GFLOP=.../s) for every shape, and for decode
// (M <= 16) GB of weights read per second. The
// decode benchmarks rotate over enough weight matrices (>= 192 MiB) that every call
// reads its weights from DRAM, as a real model's layers do. TP_BENCH_CACHED=1 keeps
// one quantized matrix instead, which stays in cache: the decode kernels' arithmetic
// rate, apart from the memory's. BM_decode_token_linears_* run one decode token's linears of qwen3-0.6b
// (28 layers, and lm_head where the name says), bf16 and quantized, weights streamed from DRAM:
//
//   OMP_NUM_THREADS=1 taskset -c 1 ./build/bench/ops/bench_matmul --benchmark_filter=decode_token
//       --benchmark_repetitions=5
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <map>
#include <oneapi/dnnl/dnnl.hpp>
#include <string>
#include <utility>
#include <vector>

#include "tp/autograd/tape.h"
#include "tp/ops/gemm.h"
#include "tp/ops/linear.h"
#include "tp/ops/quantized_linear.h"
#include "tp/tensor/random.h"
#include "tp/tensor/storage.h"

using namespace tp;

namespace {

struct Shape3 {
  int64_t m, k, n;
};

// The first is bench_inference's "bf16 matmul rate"; then qwen3-0.6b's prefill-512
// GEMMs at tp = 1 (q|k|v and gate|up fused, o_proj, down_proj is the second) and
// k_proj / v_proj alone, as they ran before the fusion; then decode's GEMV, and
// a batched decode step's product over 4, 8 and 16 rows (serving's slots).
const Shape3 kShapes[] = {{512, 1024, 3072}, {512, 3072, 1024}, {512, 1024, 4096}, {512, 1024, 6144},
                          {512, 2048, 1024}, {512, 1024, 1024}, {1, 4096, 4096},    {4, 4096, 4096},
                          {8, 4096, 4096},   {16, 4096, 4096}};
// Decode's rows: the weights are streamed from memory, and read at a rate.
constexpr int64_t kDecodeRows = 16;

// Weight copies [N, K] so that decode streams from memory rather than cache.
// Not inlined: GCC 12.2 -O3 miscompiled the inlined loop (it built the shape
// {N, K} from a register it had just zeroed, so every weight came out [0, 0]).
__attribute__((noinline)) std::vector<Tensor> make_weights(const Shape3& s, DType dt) {
  int copies = 1;
  if (s.m <= kDecodeRows) {
    size_t bytes = static_cast<size_t>(s.k * s.n) * dtype_size(dt);
    copies = static_cast<int>(std::max<size_t>(2, (size_t{192} << 20) / bytes));
  }
  std::vector<Tensor> ws;
  Shape shape{s.n, s.k};
  ws.push_back(Tensor::randn(shape, 100, 0.f, 0.02f, dt));
  for (int i = 1; i < copies; ++i) ws.push_back(ws[0].clone());  // distinct memory is what counts
  return ws;
}

void set_counters(benchmark::State& state, const Shape3& s, DType dt) {
  double flops = 2.0 * s.m * s.n * s.k;
  state.counters["GFLOP"] = benchmark::Counter(flops * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  double bytes = static_cast<double>(s.k * s.n) * dtype_size(dt);
  if (s.m <= kDecodeRows) state.counters["GB"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

void bm_tp_linear(benchmark::State& state, Shape3 s, DType dt) {
  autograd::NoGradGuard no_grad;
  std::vector<ops::PackedLinear> ws;
  for (const Tensor& w : make_weights(s, dt)) ws.emplace_back(w);
  Tensor x = Tensor::randn({s.m, s.k}, 1);
  size_t i = 0;
  for (auto _ : state) {
    Tensor y = ops::linear(x, ws[i++ % ws.size()]);
    benchmark::DoNotOptimize(y.raw_data());
  }
  set_counters(state, s, dt);
}

// The baseline: what a hand-written oneDNN caller gets, with src already in the
// weight's dtype (no conversion), weights packed by tag::any + reorder into memory
// oneDNN allocates (4 KiB pages) or, with huge_pages, into a huge-page Storage as
// PackedLinear does (this VM pays heavily for TLB misses when decode streams weights).
void bm_onednn(benchmark::State& state, Shape3 s, DType dt, bool huge_pages) {
  if (dt == DType::BF16 && !ops::detail::bf16_matmul_available()) {
    state.SkipWithError("oneDNN has no bf16 matmul on this CPU (AVX2 only): the baseline is BM_onednn_f32");
    return;
  }
  using dnnl::memory;
  dnnl::engine eng(dnnl::engine::kind::cpu, 0);
  dnnl::stream strm(eng);
  memory::data_type mdt = dt == DType::BF16 ? memory::data_type::bf16 : memory::data_type::f32;
  memory::desc x_md({s.m, s.k}, mdt, memory::format_tag::ab);
  memory::desc w_any({s.k, s.n}, mdt, memory::format_tag::any);
  memory::desc y_md({s.m, s.n}, memory::data_type::f32, memory::format_tag::ab);
  dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(x_md, w_any, y_md), eng);
  dnnl::matmul prim(pd);
  std::vector<Tensor> user_ws = make_weights(s, dt);
  std::vector<memory> packed;
  std::vector<std::shared_ptr<Storage>> buffers;
  for (const Tensor& w : user_ws) {
    memory user(memory::desc({s.k, s.n}, mdt, memory::format_tag::ba), eng, w.raw_data());
    if (huge_pages) {
      buffers.push_back(Storage::allocate(pd.weights_desc().get_size()));
      packed.emplace_back(pd.weights_desc(), eng, buffers.back()->data());
    } else {
      packed.emplace_back(pd.weights_desc(), eng);
    }
    dnnl::reorder(user, packed.back()).execute(strm, user, packed.back());
  }
  strm.wait();
  Tensor x = Tensor::randn({s.m, s.k}, 1, 0.f, 1.f, dt), y = Tensor::empty({s.m, s.n});
  memory x_mem(x_md, eng, x.raw_data()), y_mem(y_md, eng, y.raw_data());
  size_t i = 0;
  for (auto _ : state) {
    prim.execute(strm, {{DNNL_ARG_SRC, x_mem}, {DNNL_ARG_WEIGHTS, packed[i++ % packed.size()]}, {DNNL_ARG_DST, y_mem}});
    strm.wait();
  }
  set_counters(state, s, dt);
}

// Random codes, f16-valued scales and zeros in groups of 128 along K; bits 0: MXFP4 (random E2M1 codes, an
// exponent per 32 inputs).
__attribute__((noinline)) ops::QuantizedLinear make_quantized(const Shape3& s, int bits, uint64_t seed) {
  if (bits == 0) {
    Tensor codes = Tensor::empty({s.n, s.k}, DType::U8), exponents = Tensor::empty({s.n, s.k / 32}, DType::U8);
    for (int64_t i = 0; i < s.n * s.k; ++i) codes.data<uint8_t>()[i] = static_cast<uint8_t>(mix64(seed + i) % 16);
    for (int64_t i = 0; i < s.n * s.k / 32; ++i)
      exponents.data<uint8_t>()[i] = static_cast<uint8_t>(118 + mix64(~seed - i) % 8);
    return ops::QuantizedLinear::e2m1(codes, exponents);
  }
  const int64_t groups = (s.k + 127) / 128;
  Tensor codes = Tensor::empty({s.n, s.k}, DType::U8), zeros = Tensor::empty({s.n, groups}, DType::U8);
  Tensor scales = Tensor::empty({s.n, groups});
  uint64_t r = seed * 6364136223846793005ull + 1;
  auto next = [&r] { return (r = r * 6364136223846793005ull + 1442695040888963407ull) >> 33; };
  for (int64_t i = 0; i < s.n * s.k; ++i) codes.data<uint8_t>()[i] = static_cast<uint8_t>(next() % (1u << bits));
  for (int64_t i = 0; i < s.n * groups; ++i) {
    zeros.data<uint8_t>()[i] = static_cast<uint8_t>(next() % (1u << bits));
    scales.data<float>()[i] = to_f32(to_f16(0.001f + 0.01f * static_cast<float>(next() % 1000) / 1000.f));
  }
  return ops::QuantizedLinear(bits, 128, codes, scales, zeros);
}

// `decode_steps`: every row flagged a decode step (ops::linear's decode_rows: a server's step of that many
// sequences), else the row count picks the kernel (up to 4 rows decode's, more prefill's).
void bm_tp_quantized(benchmark::State& state, Shape3 s, int bits, DType compute, bool decode_steps) {
  std::vector<ops::QuantizedLinear> ws{make_quantized(s, bits, 1)};
  const size_t bytes = ws[0].nbytes();
  // Decode streams from memory: enough distinct copies (>= 192 MiB) to defeat the caches.
  const char* cached_env = std::getenv("TP_BENCH_CACHED");
  const bool cached = cached_env != nullptr && std::string(cached_env) == "1";
  // (Up to 64 rows: an MoE expert's share of a prompt also reads its weight from memory.)
  const size_t copies = s.m <= 64 && !cached ? std::max<size_t>(2, (size_t{192} << 20) / bytes) : 1;
  for (size_t c = 1; c < copies; ++c) ws.push_back(make_quantized(s, bits, 1 + c));
  Tensor x = Tensor::randn({s.m, s.k}, 1), y = Tensor::empty({s.m, s.n});
  const std::vector<uint8_t> flags(decode_steps ? static_cast<size_t>(s.m) : 0, 1);
  size_t i = 0;
  for (auto _ : state) {
    ops::linear_into(y, x, ws[i++ % ws.size()], Tensor(), compute, flags);
    benchmark::DoNotOptimize(y.raw_data());
  }
  state.counters["GFLOP"] =
      benchmark::Counter(2.0 * s.m * s.n * s.k * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  if (s.m <= kDecodeRows)
    state.counters["GB"] = benchmark::Counter(static_cast<double>(bytes) * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
}

// One decode token's linears at tp = 1, in the model's order: qwen3-0.6b's 28 layers of q|k|v (fused), o_proj,
// gate|up (fused) and down_proj, one row each, then (with_head) lm_head. Each weight is its own memory, so the
// token streams every byte from DRAM as a model's decode does, without attention, norms or sampling: the
// kernels' share of a token, bf16 against the quantized forms in the same run. The GB counter counts the
// bytes held (bf16: 2 a weight; quantized: codes, scales and zeros).
constexpr int64_t kQwen3Hidden = 1024, kQwen3Layers = 28, kQwen3Vocab = 151936;
const Shape3 kQwen3LayerLinears[] = {{1, kQwen3Hidden, 4096}, {1, 2048, kQwen3Hidden}, {1, kQwen3Hidden, 6144},
                                     {1, 3072, kQwen3Hidden}};

void bm_decode_token_linears(benchmark::State& state, int bits, bool with_head) {
  autograd::NoGradGuard no_grad;
  std::vector<Shape3> shapes;
  for (int64_t l = 0; l < kQwen3Layers; ++l) shapes.insert(shapes.end(), std::begin(kQwen3LayerLinears), std::end(kQwen3LayerLinears));
  if (with_head) shapes.push_back({1, kQwen3Hidden, kQwen3Vocab});
  std::vector<ops::PackedLinear> dense;  // each packs its own copy: one random weight a shape will do
  std::map<std::pair<int64_t, int64_t>, Tensor> dense_weights;
  std::vector<ops::QuantizedLinear> quantized;
  std::vector<Tensor> xs, ys;
  double bytes = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const Shape3& s = shapes[i];
    if (bits == 16) {
      Tensor& w = dense_weights[{s.n, s.k}];
      if (!w.defined()) w = Tensor::randn({s.n, s.k}, 100 + i, 0.f, 0.02f, DType::BF16);
      dense.emplace_back(w, false);
      bytes += 2.0 * static_cast<double>(s.n * s.k);
    } else {
      quantized.push_back(make_quantized(s, bits, 100 + i));
      bytes += static_cast<double>(quantized.back().nbytes());
    }
    xs.push_back(Tensor::randn({1, s.k}, 1 + i));
    ys.push_back(Tensor::empty({1, s.n}));
  }
  for (auto _ : state) {
    for (size_t i = 0; i < shapes.size(); ++i) {
      if (bits == 16)
        ops::linear_into(ys[i], xs[i], dense[i]);
      else
        ops::linear_into(ys[i], xs[i], quantized[i]);
    }
    benchmark::DoNotOptimize(ys.back().raw_data());
  }
  state.counters["GB"] = benchmark::Counter(bytes * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["MB_token"] = bytes * 1e-6;
}

std::string shape_name(const Shape3& s) {
  return "/M:" + std::to_string(s.m) + "/K:" + std::to_string(s.k) + "/N:" + std::to_string(s.n);
}

}  // namespace

int main(int argc, char** argv) {
  for (const Shape3& s : kShapes) {
    for (DType dt : {DType::F32, DType::BF16}) {
      std::string suffix = std::string(dtype_name(dt)) + shape_name(s);
      // Explicit captures: the variadic RegisterBenchmark overload of the installed
      // Google Benchmark (1.7.1) passed zeroed Shape3 fields at -O3.
      benchmark::RegisterBenchmark(("BM_tp_linear_" + suffix).c_str(), [s, dt](benchmark::State& st) {
        bm_tp_linear(st, s, dt);
      })->UseRealTime();
      benchmark::RegisterBenchmark(("BM_onednn_" + suffix).c_str(), [s, dt](benchmark::State& st) {
        bm_onednn(st, s, dt, false);
      })->UseRealTime();
      if (s.m == 1)
        benchmark::RegisterBenchmark(("BM_onednn_hugepages_" + suffix).c_str(), [s, dt](benchmark::State& st) {
          bm_onednn(st, s, dt, true);
        })->UseRealTime();
    }
  }
  // Prefill shapes in both arithmetics (f32; bf16, a bf16 model's); decode's kernels are the same in both.
  for (const Shape3& s : kShapes)
    for (int bits : {8, 4})
      for (DType compute : {DType::F32, DType::BF16}) {
        if (compute == DType::BF16 && s.m <= kDecodeRows) continue;
        const std::string name = "BM_tp_quantized_int" + std::to_string(bits) + "_g128" +
                                 (compute == DType::BF16 ? "_bf16" : "") + shape_name(s);
        benchmark::RegisterBenchmark(name.c_str(), [s, bits, compute](benchmark::State& st) {
          bm_tp_quantized(st, s, bits, compute, false);
        })->UseRealTime();
        // A server's decode step of 5-16 sequences: decode's kernels, four rows a pass (against the above's
        // prefill path for the same rows, in the same run).
        if (s.m > 4 && s.m <= kDecodeRows && compute == DType::F32)
          benchmark::RegisterBenchmark((name + "/decode_steps").c_str(), [s, bits, compute](benchmark::State& st) {
            bm_tp_quantized(st, s, bits, compute, true);
          })->UseRealTime();
      }
  // GPT-OSS's experts at decode (gpt-oss-20b: gate_up [5760, 2880], down [2880, 2880]; 1 and 4 rows): MXFP4
  // against 4-bit codes in groups of 128, the same shapes in the same run.
  for (const Shape3& s : {Shape3{1, 2880, 5760}, Shape3{1, 2880, 2880}, Shape3{4, 2880, 5760}})
    for (const int bits : {0, 4}) {
      const std::string name =
          std::string("BM_tp_quantized_") + (bits == 0 ? "mxfp4" : "int4_g128") + "_expert" + shape_name(s);
      benchmark::RegisterBenchmark(name.c_str(), [s, bits](benchmark::State& st) {
        bm_tp_quantized(st, s, bits, DType::F32, false);
      })->UseRealTime();
    }
  // An MoE expert's prompt rows (qwen3-30b-a3b's gate [768, 2048]): decode's kernels (/decode_steps) against
  // prefill's dequantize-and-GEMM in bf16, the same rows in the same run (QuantizedLinear::decode_rows_limit).
  for (const int64_t rows : {16, 32, 48, 64})
    for (const int bits : {8, 4}) {
      const Shape3 s{rows, 2048, 768};
      const std::string name = "BM_tp_quantized_int" + std::to_string(bits) + "_g128_expert_rows" + shape_name(s);
      benchmark::RegisterBenchmark((name + "/decode_steps").c_str(), [s, bits](benchmark::State& st) {
        bm_tp_quantized(st, s, bits, DType::F32, true);
      })->UseRealTime();
      benchmark::RegisterBenchmark((name + "/prefill_bf16").c_str(), [s, bits](benchmark::State& st) {
        bm_tp_quantized(st, s, bits, DType::BF16, false);
      })->UseRealTime();
    }
  for (const bool head : {false, true})
    for (const int bits : {16, 8, 4}) {
      const std::string name = std::string("BM_decode_token_linears_qwen3_0.6b_") +
                               (bits == 16 ? "bf16" : bits == 8 ? "int8_g128" : "int4_g128") + (head ? "_lm_head" : "");
      benchmark::RegisterBenchmark(name.c_str(), [bits, head](benchmark::State& st) {
        bm_decode_token_linears(st, bits, head);
      })->UseRealTime()->Unit(benchmark::kMillisecond);
    }
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
