// Decode rates of several checkpoints taken turn by turn in one process, so that each ratio between them compares
// tokens decoded within the same second. This machine's read bandwidth swings by 2x within minutes, more than the
// differences between weight formats that separate runs try to measure: in run_quant_bench's rounds, even plain
// read passes of int4 + head's and bf16's token bytes came out 2.2-4.1x apart in consecutive runs (bytes: 3.35x).
//
// Every model (tp = the world size, 1 thread a rank) takes the same --prefill prompt into its own KV cache; then
// the models take turns of --tokens greedy decode steps (picked as tp generate picks), the order rotating every
// turn, for --turns turns after one warm-up turn. All models are at the same cache length in every turn, so each
// turn's ratios compare the same work apart from the weights. Rank 0 prints one JSON line: each model's decode
// tokens/s over its turns, its rate against the first model's, turn by turn (median, min and max), and its greedy
// tokens (the prompt's, then every step's, the warm-up turn's included), which bench_inference gives too.
//
//   taskset -c 1 build/bench/models/bench_decode_pair --model out/qwen3-0.6b --model out/qwen3-0.6b-int4-g128
//   build/src/tprun --nproc-per-node 2 build/bench/models/bench_decode_pair --model A --model B ...
//   [--prefill 512] [--tokens 4] [--turns 16]
#include <CLI/CLI.hpp>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "bench_util.h"
#include "tp/autograd/tape.h"
#include "tp/distributed/process_group.h"
#include "tp/generation/sampling.h"
#include "tp/models/auto.h"
#include "tp/ops/sampling.h"

using namespace tp;
using bench::Clock;
using bench::seconds;

namespace {

// One checkpoint mid-decode: the model, its cache and the token it feeds next.
struct Decoder {
  std::string path;
  std::unique_ptr<PretrainedModel> model;
  KVState cache;
  int64_t next = 0;
  std::vector<int64_t> tokens;  // the prompt's greedy token, then every decode step's (bench_inference's "tokens")
  bool on_shards = false;       // greedy from each rank's slice of the logits (tp generate's rule)

  int64_t pick(const CausalLMOutput& out, int64_t step) {
    if (on_shards) return generation::vocab_parallel_argmax(out.logits, out.vocab_start, model->mesh().group("tp"))[0];
    return ops::sample_tokens(out.logits, {}, {0}, {step}).to_int_vector()[0];
  }
};

}  // namespace

int main(int argc, char** argv) {
  dist::init(&argc, &argv);
  CLI::App app{"decode rates of several checkpoints, turn by turn in one process"};
  std::vector<std::string> paths;
  int64_t prefill = 512, tokens = 4, turns = 16;
  app.add_option("--model", paths, "checkpoint directories (at least 2; ratios are against the first)")
      ->required()
      ->check(CLI::ExistingDirectory);
  app.add_option("--prefill", prefill, "prompt tokens in every model's cache before decoding")
      ->check(CLI::PositiveNumber);
  app.add_option("--tokens", tokens, "decode steps a turn")->check(CLI::PositiveNumber);
  app.add_option("--turns", turns, "measured turns of every model")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  if (paths.size() < 2) {
    std::fprintf(stderr, "bench_decode_pair: give at least 2 --model directories (got %zu)\n", paths.size());
    return 2;
  }

  autograd::NoGradGuard no_grad;
  const int64_t M = static_cast<int64_t>(paths.size());
  std::vector<Decoder> models(paths.size());
  for (int64_t m = 0; m < M; ++m) {
    LoadOptions options;
    options.dtype = DType::BF16;
    options.verbose = false;
    Decoder& d = models[m];
    d.path = paths[m];
    d.model = std::make_unique<PretrainedModel>(AutoModelForCausalLM::from_pretrained(d.path, options));
    d.cache = d.model->lm().make_kv_state(1, prefill + (turns + 1) * tokens + 1);
    d.on_shards = d.model->tp_size() > 1 && !d.model->mesh().has_dim("ep") && d.model->can_shard_logits();
    const int64_t V = d.model->config().vocab_size;
    const std::vector<int64_t> prompt = bench::synthetic_prompt(prefill, V);
    const CausalLMOutput out = d.model->lm().forward_ids(Tensor::from_ints(prompt, {1, prefill}),
                                                         {.cache = &d.cache, .logit_positions = {prefill - 1}});
    d.next = d.pick(out, 0);
    d.tokens.push_back(d.next);
  }
  dist::ProcessGroup& group = dist::world();

  // seconds[m][t]: model m's turn t (turn 0 warms up and is not kept).
  std::vector<std::vector<double>> turn_s(paths.size());
  int64_t step = 1;
  for (int64_t t = 0; t <= turns; ++t, step += tokens) {
    for (int64_t i = 0; i < M; ++i) {
      Decoder& d = models[(t + i) % M];
      group.barrier();
      const Clock::time_point t0 = Clock::now();
      for (int64_t s = 0; s < tokens; ++s) {
        const CausalLMOutput out = d.model->lm().forward_ids(
            Tensor::from_ints({d.next}, {1, 1}),
            {.cache = &d.cache, .logit_positions = {0}, .decode = true, .sharded_logits = d.on_shards});
        d.next = d.pick(out, step + s);
        d.tokens.push_back(d.next);
      }
      group.barrier();
      if (t > 0) turn_s[(t + i) % M].push_back(seconds(t0));
    }
  }

  if (group.rank() == 0) {
    nlohmann::json j = {{"ranks", group.size()}, {"prefill", prefill}, {"tokens_a_turn", tokens}, {"turns", turns}};
    for (int64_t m = 0; m < M; ++m) {
      double total = 0;
      std::vector<double> ratio;
      for (int64_t t = 0; t < turns; ++t) {
        total += turn_s[m][t];
        ratio.push_back(turn_s[0][t] / turn_s[m][t]);  // this model's rate over the first's, same turn
      }
      j["models"].push_back({{"model", paths[m]},
                             {"decode_tokens_per_s", static_cast<double>(turns * tokens) / total},
                             {"rate_over_first_median", bench::median(ratio)},
                             {"rate_over_first_min", *std::min_element(ratio.begin(), ratio.end())},
                             {"rate_over_first_max", *std::max_element(ratio.begin(), ratio.end())},
                             {"tokens", models[m].tokens}});
    }
    std::printf("%s\n", j.dump().c_str());
  }
  return 0;
}
