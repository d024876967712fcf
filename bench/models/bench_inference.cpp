// End-to-end inference benchmark of one rank group: prefill P tokens and decode
// D tokens at batch 1, repeated; medians. In the same process it measures the
// machine's two ceilings the targets are stated against: the bf16 matmul rate
// (M=512, K=1024, N=3072 through a packed weight, rank 0; both tp's, which takes
// the paired-f32 form where that is faster, and oneDNN's own bf16 kernel's) and a
// STREAM-like read bandwidth (sum over 1 GiB, every rank at once: the memory bus
// is shared). Rank 0 prints one JSON line. bench/models/run_inference_bench.py
// alternates tp = 1 and tp = 2 runs of it and reports paired ratios;
// bench/models/run_moe_bench.py does the same for a MoE model at ep = 2 and tp = 2.
//
// MoE models: a decode step reads the weights of the top_k experts each sparse
// layer routes the token to, not all of them: the weight bytes per token count
// those (on each rank its share: I / tp of each, or under expert parallelism
// the expected top_k / ep of its own experts), plus the routers. The time each
// group spent in collectives (ProcessGroup::collective_seconds, waiting for the
// slower rank included: "ep" the token dispatch's all-to-alls and the all-reduce
// of its token chunks, "tp" the all-reduces and lm_head's gather) is given per token.
// Decode also reads the KV cache: kv_cache_bytes_per_decode_token_rank0 is the
// mean over the decode steps of the rows every layer's attention reads, and
// decode_weight_and_kv_read_share_by_chunk_median sets weights plus those rows
// against the read bandwidth around each chunk, as the weights-only share does.
// Decode picks its greedy token as tp generate does: at tp > 1 with a column-parallel
// lm_head, from each rank's slice of the logits (generation::vocab_parallel_argmax),
// not from the whole row gathered on every rank; else from the whole row by
// ops::sample_tokens' greedy scan.
//
// Rank 0's JSON also carries the greedy tokens of the last repetition (the prefill's
// argmax, then each decode step's) and the prefill's top-8 logits, which
// bench/models/run_speedup_chart.py compares with PyTorch's (same prompt: token i =
// (i * 7919 + 13) % vocab_size). The warmup repetition can be shorter than the timed
// ones (--warmup-prefill, --warmup-decode) where a long prefill would double a run.
//
//   mpirun -np N bench_inference --model DIR [--prefill 512] [--decode 128] [--reps 3] [--tp-size T --ep-size E]
//                                [--warmup-prefill N] [--warmup-decode N] [--skip-ceilings]
#include <immintrin.h>
#include <omp.h>
#include <sys/resource.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <iostream>
#include <nlohmann/json.hpp>
#include <utility>
#include <vector>

#include "bench_util.h"
#include "tp/autograd/tape.h"
#include "tp/distributed/process_group.h"
#include "tp/generation/sampling.h"
#include "tp/models/auto.h"
#include "tp/nn/layers.h"
#include "tp/nn/moe.h"
#include "tp/ops/linear.h"
#include "tp/ops/sampling.h"

using namespace tp;
using bench::Clock;
using bench::median;
using bench::peak_rss;
using bench::seconds;

namespace {

// A [512 x 1024] x [1024 x 3072] bf16 product through a packed weight, as the
// model's prefill runs it (`path` Auto: the paired-f32 form where that is faster
// and exact, ops/bf16_pairs.h) or through oneDNN's bf16 kernel (Native); GFLOP/s.
double matmul_gflops(ops::detail::Bf16Path path) {
  Tensor x = Tensor::randn({512, 1024}, 1);
  ops::PackedLinear w(Tensor::randn({3072, 1024}, 2, 0, 0.02f, DType::BF16));
  Tensor y = Tensor::empty({512, 3072});
  std::vector<double> t;
  for (int r = 0; r < 12; ++r) {
    auto t0 = Clock::now();
    ops::detail::linear_into_path(y, x, w, Tensor(), path);
    t.push_back(seconds(t0));
  }
  return 2.0 * 512 * 1024 * 3072 / median(t) / 1e9;
}

// One pass over `a` with 32-byte loads into eight independent accumulators per
// thread (enough loads in flight to saturate DRAM); seconds. Every rank of `group`
// starts together, so under tp = N this is what each rank gets while all N read.
double timed_read_pass(const Tensor& a, dist::ProcessGroup& group) {
  const int64_t n = a.numel();
  const float* p = a.data<float>();
  group.barrier();
  auto t0 = Clock::now();
  float total = 0;
#pragma omp parallel reduction(+ : total)
  {
    __m256 acc[8];
    for (__m256& v : acc) v = _mm256_setzero_ps();
#pragma omp for schedule(static)
    for (int64_t i = 0; i < n; i += 64)
      for (int j = 0; j < 8; ++j) acc[j] = _mm256_add_ps(acc[j], _mm256_load_ps(p + i + 8 * j));
    for (int j = 1; j < 8; ++j) acc[0] = _mm256_add_ps(acc[0], acc[j]);
    float lanes[8];
    _mm256_storeu_ps(lanes, acc[0]);
    total += lanes[0];
  }
  volatile float sink = total;  // keeps the loads
  (void)sink;
  return seconds(t0);
}

// The median of five passes over 1 GiB (larger than any cache); GB/s.
double read_bandwidth_gbs(dist::ProcessGroup& group) {
  Tensor a = Tensor::full({(int64_t{1} << 30) / 4}, 1.0);
  std::vector<double> t;
  for (int r = 0; r < 5; ++r) t.push_back(timed_read_pass(a, group));
  return static_cast<double>(a.nbytes()) / median(t) / 1e9;
}

}  // namespace

int main(int argc, char** argv) {
  dist::init(&argc, &argv);
  CLI::App app{"tp inference benchmark"};
  std::string model_dir, dtype = "bf16";
  int64_t prefill = 512, decode = 128, reps = 3, tp_size = 0, ep_size = 1, warmup_prefill = 0, warmup_decode = -1;
  bool skip_ceilings = false;
  app.add_option("--tp-size", tp_size, "default: the world size (with --ep-size: the plan's rules)");
  app.add_option("--ep-size", ep_size, "expert parallelism (MoE models): the world size, or 1");
  app.add_option("--model", model_dir)->required();
  app.add_option("--prefill", prefill);
  app.add_option("--decode", decode);
  app.add_option("--reps", reps);
  app.add_option("--warmup-prefill", warmup_prefill, "prompt tokens of the warmup repetition (0: --prefill)");
  app.add_option("--warmup-decode", warmup_decode, "decode steps of the warmup repetition (-1: --decode)");
  app.add_flag("--skip-ceilings", skip_ceilings);
  CLI11_PARSE(app, argc, argv);

  autograd::NoGradGuard no_grad;
  auto t_load = Clock::now();
  LoadOptions options;
  options.dtype = DType::BF16;
  options.verbose = false;
  if (tp_size > 0) options.distributed_config.tp_size = tp_size;
  if (ep_size > 1) options.distributed_config.ep_size = ep_size;
  PretrainedModel model = AutoModelForCausalLM::from_pretrained(model_dir, options);
  double load_s = seconds(t_load);
  CausalLM& lm = model.lm();
  dist::ProcessGroup& group = model.mesh().root_group();  // every rank (under ep: every tp group)
  const int64_t V = model.config().vocab_size;

  const std::vector<int64_t> prompt = bench::synthetic_prompt(prefill, V);
  Tensor ids = Tensor::from_ints(prompt, {1, prefill});
  KVState state = lm.make_kv_state(1, prefill + decode + 1);

  // The machine's bandwidth drifts within seconds, so decode is also measured
  // in chunks of kChunk tokens with a short read pass (256 MiB) before and after
  // each: every chunk's weight read rate is compared with the bandwidth of the
  // same moment (read_share_by_chunk); decode_s excludes the passes.
  constexpr int64_t kChunk = 16;
  Tensor probe = Tensor::full({(int64_t{256} << 20) / 4}, 1.0);
  auto probe_gbs = [&] { return static_cast<double>(probe.nbytes()) / timed_read_pass(probe, group) / 1e9; };
  std::vector<double> chunk_s, chunk_ceiling_gbs;
  std::vector<int64_t> chunk_first;  // each measured chunk's first decode step

  // Collective seconds of the tp and ep groups (rank 0's), over the measured prefills and decodes.
  dist::ProcessGroup& tp_group = model.mesh().group("tp");
  dist::ProcessGroup* ep_group = model.mesh().has_dim("ep") ? &model.mesh().group("ep") : nullptr;
  auto comm = [&] { return std::pair{tp_group.collective_seconds(), ep_group ? ep_group->collective_seconds() : 0.0}; };
  const bool on_shards = model.tp_size() > 1 && ep_group == nullptr && model.can_shard_logits();
  double prefill_tp_comm = 0, prefill_ep_comm = 0, decode_tp_comm = 0, decode_ep_comm = 0;

  std::vector<double> prefill_s, decode_s;
  std::vector<int64_t> tokens;
  std::vector<std::pair<int64_t, double>> prefill_top;
  for (int64_t r = 0; r <= reps; ++r) {  // rep 0 warms up
    const int64_t p_len = r > 0 || warmup_prefill <= 0 ? prefill : std::min(warmup_prefill, prefill);
    const int64_t d_len = r > 0 || warmup_decode < 0 ? decode : std::min(warmup_decode, decode);
    Tensor in = p_len == prefill
                    ? ids
                    : Tensor::from_ints(std::vector<int64_t>(prompt.begin(), prompt.begin() + p_len), {1, p_len});
    for (auto& c : state.layers) c.reset();
    group.barrier();
    auto c0 = comm();
    auto t0 = Clock::now();
    Tensor logits = lm.forward_ids(in, {.cache = &state, .logit_positions = {p_len - 1}}).logits;
    double tp = seconds(t0);
    auto c1 = comm();
    if (r > 0) {
      prefill_tp_comm += c1.first - c0.first;
      prefill_ep_comm += c1.second - c0.second;
    }
    const float* l = logits.data<float>();
    int64_t next = std::max_element(l, l + V) - l;
    tokens.assign({next});
    std::vector<int64_t> order(static_cast<size_t>(V));
    for (int64_t i = 0; i < V; ++i) order[i] = i;
    std::partial_sort(order.begin(), order.begin() + std::min<int64_t>(8, V), order.end(),
                      [&](int64_t a, int64_t b) { return l[a] > l[b]; });
    prefill_top.clear();
    for (int64_t i = 0; i < std::min<int64_t>(8, V); ++i) prefill_top.emplace_back(order[i], l[order[i]]);
    double td = 0, before = probe_gbs();
    for (int64_t s0 = 0; s0 < d_len; s0 += kChunk) {
      group.barrier();
      auto d0 = comm();
      auto t1 = Clock::now();
      for (int64_t s = s0; s < std::min(d_len, s0 + kChunk); ++s) {
        const CausalLMOutput out = lm.forward_ids(
            Tensor::from_ints({next}, {1, 1}),
            {.cache = &state, .logit_positions = {0}, .decode = true, .sharded_logits = on_shards});
        if (on_shards) {
          next = generation::vocab_parallel_argmax(out.logits, out.vocab_start, tp_group)[0];
        } else {
          next = ops::sample_tokens(out.logits, {}, {0}, {s}).to_int_vector()[0];
        }
        tokens.push_back(next);
      }
      double tc = seconds(t1);
      auto d1 = comm();
      if (r > 0) {
        decode_tp_comm += d1.first - d0.first;
        decode_ep_comm += d1.second - d0.second;
      }
      double after = probe_gbs();
      td += tc;
      if (r > 0 && s0 + kChunk <= d_len) {
        chunk_s.push_back(tc);
        chunk_ceiling_gbs.push_back((before + after) / 2);
        chunk_first.push_back(s0);
      }
      before = after;
    }
    if (r > 0) {
      prefill_s.push_back(tp);
      decode_s.push_back(td);
    }
  }

  // What one token costs this rank: every Linear's weight is read once per
  // decode step (bf16, or a quantized checkpoint's codes, scales and zeros), and prefill multiplies every token by all of them but
  // lm_head (logits only for the last position).
  int64_t weight_bytes = 0, active_bytes = 0, expert_bytes = 0;  // this rank's; the whole model's active; all experts'
  // This rank's of lm_head, read last in a token (run_quant_bench.py gives bench_sync_stream the layers and it apart).
  int64_t head_bytes = 0;
  double prefill_flops = 0;
  const int64_t ep = model.ep_size();
  for (nn::Module* m : lm.modules()) {
    if (auto* router = dynamic_cast<nn::TopKRouter*>(m)) {
      weight_bytes += numel(router->weight.global_shape) * 2;
      active_bytes += numel(router->weight.global_shape) * 2;
      continue;
    }
    if (auto* experts = dynamic_cast<nn::MoeExperts*>(m)) {
      // One expert's bytes, whole and as this rank holds it (I / tp under tp, whole under ep).
      const int64_t whole = (numel(experts->gate_up_proj.global_shape) + numel(experts->down_proj.global_shape)) /
                            experts->num_experts() * 2;
      // (MXFP4 experts kept packed: the bytes their codes and scales hold.)
      const int64_t local =
          experts->packed()
              ? static_cast<int64_t>(experts->packed_bytes()) / experts->num_local_experts()
              : (numel(nn::local_shape(experts->gate_up_proj)) + numel(nn::local_shape(experts->down_proj))) /
                    experts->num_local_experts() * 2;
      const double k = static_cast<double>(experts->top_k());
      weight_bytes += static_cast<int64_t>(k / static_cast<double>(experts->experts_sharded() ? ep : 1) * local);
      active_bytes += experts->top_k() * whole;
      expert_bytes += experts->num_experts() * whole;
      prefill_flops += 2.0 * k * static_cast<double>(local / 2) * static_cast<double>(prefill) /
                       static_cast<double>(experts->experts_sharded() ? ep : 1);
      continue;
    }
    auto* linear = dynamic_cast<nn::Linear*>(m);
    if (linear == nullptr) continue;
    int64_t n = numel(nn::local_shape(linear->weight));
    // A quantized checkpoint's Linear: its codes, scales and zeros are what is read.
    const int64_t held = linear->quantized().defined() ? static_cast<int64_t>(linear->quantized().nbytes()) : n * 2;
    weight_bytes += held;
    active_bytes += held * (numel(linear->weight.global_shape) / n);
    if (linear->name() == "lm_head") head_bytes += held;
    prefill_flops += 2.0 * static_cast<double>(n) * static_cast<double>(linear->name() == "lm_head" ? 1 : prefill);
  }
  // Attention's two matmuls (Q K^T and P V) over the causal triangle, this rank's heads.
  const ModelConfig& c = model.config();
  prefill_flops += 2.0 * 2.0 * static_cast<double>(prefill * (prefill + 1) / 2) * static_cast<double>(c.head_dim) *
                   static_cast<double>(c.num_attention_heads / model.tp_size() * c.num_hidden_layers);
  // The probe buffer is resident from before the first forward to the end: not the model's.
  Tensor rss = Tensor::from_ints({peak_rss() - static_cast<int64_t>(probe.nbytes())}, {1});
  Tensor all_rss = group.all_gather(rss, 0);
  double gflops = 0, onednn_gflops = 0, gbs = 0;
  if (!skip_ceilings) {
    if (group.rank() == 0) {
      gflops = matmul_gflops(ops::detail::Bf16Path::Auto);
      onednn_gflops = matmul_gflops(ops::detail::Bf16Path::Native);
    }
    gbs = read_bandwidth_gbs(group);  // every rank at once
  }
  if (group.rank() == 0) {
    double pf = median(prefill_s), dc = median(decode_s);
    nlohmann::ordered_json j;
    j["tp_size"] = model.tp_size();
    j["ep_size"] = model.ep_size();
    j["threads_per_rank"] = omp_get_max_threads();
    j["load_s"] = load_s;
    j["prefill_tokens"] = prefill;
    j["prefill_s_median"] = pf;
    j["prefill_tokens_per_s"] = prefill / pf;
    j["prefill_matmul_gflops_per_rank"] = prefill_flops / pf / 1e9;
    j["decode_tokens"] = decode;
    j["decode_s_median"] = dc;
    j["decode_tokens_per_s"] = decode / dc;
    j["weight_bytes_rank0"] = weight_bytes;
    j["lm_head_bytes_rank0"] = head_bytes;
    j["active_weight_bytes_per_token"] = active_bytes;  // the whole model's, one token (MoE: top_k experts)
    if (expert_bytes > 0) j["expert_weight_bytes_all"] = expert_bytes;
    const double measured = static_cast<double>(reps);
    j["prefill_tp_collective_s_per_token"] = prefill_tp_comm / measured / static_cast<double>(prefill);
    j["prefill_ep_collective_s_per_token"] = prefill_ep_comm / measured / static_cast<double>(prefill);
    j["decode_tp_collective_s_per_token"] = decode_tp_comm / measured / static_cast<double>(decode);
    j["decode_ep_collective_s_per_token"] = decode_ep_comm / measured / static_cast<double>(decode);
    j["decode_weight_read_gbs_rank0"] = static_cast<double>(weight_bytes) * decode / dc / 1e9;
    std::vector<double> share;
    for (size_t i = 0; i < chunk_s.size(); ++i)
      share.push_back(static_cast<double>(weight_bytes) * kChunk / chunk_s[i] / 1e9 / chunk_ceiling_gbs[i]);
    if (!share.empty()) j["decode_weight_read_share_by_chunk_median"] = median(share);
    // Decode also reads the KV cache: step s (from 0) attends over prefill + s + 1 rows of every layer's keys
    // and values. Rows per token of context, this rank's kv heads; a sliding-window layer reads fewer rows
    // than it holds but is counted whole (the presets measured here have none).
    int64_t kv_row_bytes = 0;
    for (const auto& c : state.layers)
      kv_row_bytes +=
          (c.keys().numel() * dtype_size(c.keys().dtype()) + c.values().numel() * dtype_size(c.values().dtype())) /
          (c.keys().size(0) * c.max_len());
    auto kv_bytes = [&](int64_t first, int64_t steps) {  // decode steps [first, first + steps)
      return static_cast<double>(kv_row_bytes) *
             static_cast<double>(steps * (prefill + first + 1) + steps * (steps - 1) / 2);
    };
    j["kv_cache_bytes_per_decode_token_rank0"] = kv_bytes(0, decode) / static_cast<double>(decode);
    std::vector<double> with_kv;
    for (size_t i = 0; i < chunk_s.size(); ++i)
      with_kv.push_back((static_cast<double>(weight_bytes) * kChunk + kv_bytes(chunk_first[i], kChunk)) / chunk_s[i] /
                        1e9 / chunk_ceiling_gbs[i]);
    if (!with_kv.empty()) j["decode_weight_and_kv_read_share_by_chunk_median"] = median(with_kv);
    j["bf16_decode_prefetch"] = ops::detail::bf16_decode_prefetch_choice();  // -1: undecided (no large one-row bf16 product)
    j["peak_rss_bytes_per_rank"] = all_rss.to_int_vector();
    j["tokens"] = tokens;  // the last repetition's greedy tokens: the prefill's argmax, then each step's
    nlohmann::json top = nlohmann::json::array();
    for (const auto& [id, value] : prefill_top) top.push_back({id, value});
    j["prefill_top"] = top;  // [id, logit] of the prefill's 8 largest logits
    if (!skip_ceilings) {
      j["bf16_matmul_gflops_same_run"] = gflops;  // tp's packed bf16 GEMM (the paired-f32 form where it applies)
      j["bf16_onednn_matmul_gflops_same_run"] = onednn_gflops;  // oneDNN's own bf16 kernel
      j["read_bandwidth_gbs_same_run"] = gbs;  // rank 0's, while every rank reads
    }
    std::cout << j.dump() << std::endl;
  }
  return 0;
}
