// The cost of one serving step, the two ways the engine has run it: `rows`
// running sequences decode one token each while a prompt chunk of `chunk` tokens
// prefills on another row, as
//   separate: a [1, chunk] forward on the prompt's row, then a [rows, 1] decode
//             forward over the running rows (the engine before packed steps);
//   packed:   one [1, chunk + rows] forward with a segment per row
//             (ForwardOptions::segments, what tp/serving/engine.cpp runs now).
// The two alternate within one run (the running rows grow by one token per
// step either way; the prompt's row starts over each step), medians of `reps`
// each, and the median of each adjacent pair's ratio (the machine's load drifts
// within seconds); the same run also times a decode step over one row and over `rows`
// rows alone, what a step costs as the batch grows, and the seconds the
// separate and packed steps spend in tp collectives. Rank 0 prints one JSON line.
//
//   mpirun -np N bench_step --model DIR [--rows 8] [--chunk 64] [--context 92] [--reps 10]
#include <CLI/CLI.hpp>
#include <iostream>
#include <nlohmann/json.hpp>
#include <vector>

#include "bench_util.h"
#include "tp/autograd/tape.h"
#include "tp/distributed/process_group.h"
#include "tp/models/auto.h"

using namespace tp;
using bench::Clock;
using bench::median;
using bench::seconds;

namespace {

std::vector<int64_t> tokens(int64_t n, int64_t salt, int64_t vocab) {
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) out[static_cast<size_t>(i)] = ((i + salt) * 7919 + 13) % vocab;
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  dist::init(&argc, &argv);
  CLI::App app{"tp serving step benchmark"};
  std::string model_dir;
  int64_t rows = 8, chunk = 64, context = 92, reps = 10;
  app.add_option("--model", model_dir)->required();
  app.add_option("--rows", rows, "running sequences, one decode token each");
  app.add_option("--chunk", chunk, "the prompt chunk's tokens");
  app.add_option("--context", context, "tokens each running sequence holds before the first step");
  app.add_option("--reps", reps, "steps of each kind, alternating");
  CLI11_PARSE(app, argc, argv);

  autograd::NoGradGuard no_grad;
  LoadOptions options;
  options.dtype = DType::BF16;
  options.verbose = false;
  PretrainedModel model = AutoModelForCausalLM::from_pretrained(model_dir, options);
  CausalLM& lm = model.lm();
  dist::ProcessGroup& group = model.mesh().root_group();
  dist::ProcessGroup& tp_group = model.mesh().group("tp");  // its all-reduces and lm_head's gather
  const int64_t V = model.config().vocab_size;
  // Rows [0, rows) run; row `rows` prefills. Each rep grows the running rows by
  // up to 4 tokens (separate, packed, decode over 1, decode over all).
  KVState state = lm.make_kv_state(rows + 1, std::max(context + 4 * reps + 8, chunk));
  {
    ForwardOptions o{.cache = &state};
    std::vector<int64_t> ids;
    for (int64_t r = 0; r < rows; ++r) {
      const std::vector<int64_t> p = tokens(context, r * 1000, V);
      ids.insert(ids.end(), p.begin(), p.end());
      o.segments.push_back({.row = r, .tokens = context});
    }
    lm.forward_hidden(Tensor::from_ints(ids, {1, static_cast<int64_t>(ids.size())}), o);
  }
  const std::vector<int64_t> prompt = tokens(chunk, 7, V);
  const std::vector<int64_t> decode_ids = tokens(rows, 99, V);
  std::vector<int64_t> counts(static_cast<size_t>(rows), 1), zeros(static_cast<size_t>(rows), 0);

  auto separate = [&] {
    KVState one = state.rows(rows, 1);
    lm.forward_ids(Tensor::from_ints(prompt, {1, chunk}), {.cache = &one, .counts = {chunk}, .logit_positions = {chunk - 1}});
    state.take_lengths(one, rows);
    KVState running = state.rows(0, rows);
    lm.forward_ids(Tensor::from_ints(decode_ids, {rows, 1}),
                   {.cache = &running, .counts = counts, .logit_positions = zeros, .decode = true});
    state.take_lengths(running, 0);
  };
  auto packed = [&] {
    ForwardOptions o{.cache = &state};
    std::vector<int64_t> ids = prompt;
    o.segments.push_back({.row = rows, .tokens = chunk});
    o.logit_positions.push_back(chunk - 1);
    for (int64_t r = 0; r < rows; ++r) {
      ids.push_back(decode_ids[static_cast<size_t>(r)]);
      o.segments.push_back({.row = r, .tokens = 1, .decode = true});
      o.logit_positions.push_back(chunk + r);
    }
    lm.forward_ids(Tensor::from_ints(ids, {1, static_cast<int64_t>(ids.size())}), o);
  };
  auto decode = [&](int64_t n) {
    ForwardOptions o{.cache = &state};
    for (int64_t r = 0; r < n; ++r) {
      o.segments.push_back({.row = r, .tokens = 1, .decode = true});
      o.logit_positions.push_back(r);
    }
    lm.forward_ids(Tensor::from_ints(std::vector<int64_t>(decode_ids.begin(), decode_ids.begin() + n), {1, n}), o);
  };
  double comm = 0;  // the last timed step's seconds in tp collectives (waits for the slower rank included)
  auto timed = [&](const auto& step) {
    state.reset(rows);
    group.barrier();
    const double c0 = tp_group.collective_seconds();
    const auto t0 = Clock::now();
    step();
    group.barrier();
    comm = tp_group.collective_seconds() - c0;
    return seconds(t0);
  };
  timed(separate);  // warmup: oneDNN's primitives for each shape
  timed(packed);
  std::vector<double> t_separate, t_packed, t_decode1, t_decode_all, packed_ratio, decode_ratio, c_separate, c_packed;
  for (int64_t i = 0; i < reps; ++i) {
    t_separate.push_back(timed(separate));
    c_separate.push_back(comm);
    t_packed.push_back(timed(packed));
    c_packed.push_back(comm);
    t_decode1.push_back(timed([&] { decode(1); }));
    t_decode_all.push_back(timed([&] { decode(rows); }));
    packed_ratio.push_back(t_packed.back() / t_separate.back());
    decode_ratio.push_back(t_decode_all.back() / t_decode1.back());
  }
  if (group.rank() == 0) {
    nlohmann::json j{{"model", model_dir},
                     {"world", dist::world_size()},
                     {"rows", rows},
                     {"chunk", chunk},
                     {"context", context},
                     {"reps", reps},
                     {"separate_s", median(t_separate)},
                     {"packed_s", median(t_packed)},
                     {"packed_over_separate", median(t_packed) / median(t_separate)},
                     {"packed_over_separate_paired", median(packed_ratio)},
                     {"separate_tp_collective_s", median(c_separate)},
                     {"packed_tp_collective_s", median(c_packed)},
                     {"decode_1_row_s", median(t_decode1)},
                     {"decode_all_rows_s", median(t_decode_all)},
                     {"decode_all_over_1", median(t_decode_all) / median(t_decode1)},
                     {"decode_all_over_1_paired", median(decode_ratio)}};
    std::cout << j.dump() << std::endl;
  }
  return 0;
}
