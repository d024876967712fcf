// The batch engine (every rank runs it; rank 0 takes requests from another
// thread, as the HTTP handlers do): requests that arrive while others run join
// the batch, and each one's tokens equal generate()'s for its prompt alone,
// greedy or seeded, at tp = 1 and 2, with whole prompts and with prompts
// prefilled in chunks.
#include <gtest/gtest.h>

#include <functional>
#include <thread>

#include "distributed/dist_test_util.h"
#include "models/model_test_util.h"
#include "tp/distributed/process_group.h"
#include "tp/generation/generate.h"
#include "tp/ops/quantized_linear.h"
#include "tp/serving/engine.h"

using namespace tp;
using namespace std::chrono_literals;

namespace {

struct Case {
  std::vector<int64_t> prompt;
  int64_t max_tokens;
  generation::SamplingOptions sampling;
};

std::vector<int64_t> collect(serving::TokenStream &s) {
  std::vector<int64_t> out;
  while (s.wait(out, 100ms) == serving::StreamEnd::Running) {
  }
  return out;
}

} // namespace

namespace {

// A quantized checkpoint of tests/models/make_quantized_models.sh (CTest's quantized_models fixture).
std::string quantized_dir(const std::string &name) {
  const char *root = std::getenv("TP_TEST_QUANTIZED_MODELS");
  if (root == nullptr)
    throw Error("TP_TEST_QUANTIZED_MODELS is not set (CTest's make_quantized_models fixture writes the models)");
  return std::string(root) + "/" + name;
}

PretrainedModel load_quiet(const std::string &dir) {
  LoadOptions o;
  o.verbose = false;
  return AutoModelForCausalLM::from_pretrained(dir, o);
}

} // namespace

// A quantized model's products take their kernels by each token's kind
// (decode step or prompt), not by how many tokens share a step: six prompts
// in one packed forward, then six decodes beside a prompt's chunk, each get
// the bits of their row alone (a decode on a one-row cache; a prompt or chunk
// as its own forward). Dense in f32 with act-order, dense in bf16, and a MoE
// whose experts are quantized (its prompts prefill one a step: an expert's
// prompt rows still take their kernel by their count, ops/moe_experts.h).
// Counted by rows alone, the 7-9 rows of these steps would run prefill's GEMM
// for the decodes, which run decode's kernel alone.
TEST(Engine, QuantizedStepsGiveEachSequenceTheBitsItGetsAlone) {
  for (const std::string name : {"gptq-v1-4b-g128-asym-act", "ct-4b-channel-asym-bf16", "qwen3_moe-gptq-4b-g32-act"}) {
    const bool moe = name.starts_with("qwen3_moe");
    PretrainedModel model = load_quiet(quantized_dir(name));
    CausalLM &lm = model.lm();
    constexpr int64_t kRows = 7, kDecodes = 6;
    KVState batch = lm.make_kv_state(kRows, 32);
    std::vector<KVState> alone;
    std::vector<std::vector<int64_t>> prompts;
    for (int64_t r = 0; r < kRows; ++r) {
      alone.push_back(lm.make_kv_state(1, 32));
      std::vector<int64_t> p;
      for (int64_t t = 0; t < 3 + r; ++t) p.push_back((r * 37 + t * 11 + 5) % 250 + 1);
      prompts.push_back(p);
    }
    auto forward_alone = [&](int64_t r, const std::vector<int64_t> &tokens, bool decode) {
      const auto t = static_cast<int64_t>(tokens.size());
      return lm.forward_ids(Tensor::from_ints(tokens, {1, t}),
                            {.cache = &alone[r], .logit_positions = {t - 1}, .decode = decode})
          .logits;
    };
    // Step 1: rows 0-5's prompts whole, row 6's first 4 tokens (the MoE: one row a step).
    Tensor l;
    for (int64_t first = 0; first < kRows; first += moe ? 1 : kRows) {
      ForwardOptions o{.cache = &batch};
      std::vector<int64_t> ids;
      for (int64_t r = first; r < (moe ? first + 1 : kRows); ++r) {
        const auto &p = prompts[r];
        const auto take = static_cast<int64_t>(r < kDecodes ? p.size() : 4);
        ids.insert(ids.end(), p.begin(), p.begin() + take);
        o.segments.push_back({.row = r, .tokens = take});
        o.logit_positions.push_back(static_cast<int64_t>(ids.size()) - 1);
      }
      l = lm.forward_ids(Tensor::from_ints(ids, {1, static_cast<int64_t>(ids.size())}), o).logits;
      for (int64_t r = first; r < (moe ? first + 1 : kRows); ++r) {
        const auto &p = prompts[r];
        const Tensor want = forward_alone(r, {p.begin(), r < kDecodes ? p.end() : p.begin() + 4}, false);
        EXPECT_TRUE(equal(l.narrow(0, r - first, 1), want)) << name << " prompt of row " << r;
      }
    }
    // Steps 2-4: a decode on each of rows 0-5 (step 2 beside the rest of row 6's prompt, steps 3-4 beside row 6's
    // decode).
    for (int step = 2; step <= 4; ++step) {
      ForwardOptions d{.cache = &batch};
      std::vector<int64_t> step_ids;
      std::vector<bool> decode;
      std::vector<std::vector<int64_t>> parts;
      for (int64_t r = 0; r < kRows; ++r) {
        const bool rest = r == kDecodes && step == 2;
        parts.push_back(rest ? std::vector<int64_t>(prompts[r].begin() + 4, prompts[r].end())
                             : std::vector<int64_t>{(r * 13 + step * 7) % 250 + 1});
        decode.push_back(!rest);
        step_ids.insert(step_ids.end(), parts.back().begin(), parts.back().end());
        d.segments.push_back({.row = r, .tokens = static_cast<int64_t>(parts.back().size()), .decode = !rest});
        d.logit_positions.push_back(static_cast<int64_t>(step_ids.size()) - 1);
      }
      l = lm.forward_ids(Tensor::from_ints(step_ids, {1, static_cast<int64_t>(step_ids.size())}), d).logits;
      for (int64_t r = 0; r < kRows; ++r)
        EXPECT_TRUE(equal(l.narrow(0, r, 1), forward_alone(r, parts[r], decode[r])))
            << name << " step " << step << " row " << r << (decode[r] ? " (decode)" : " (prompt)");
    }
    ForwardOptions two{.cache = &batch, .segments = {{.row = 0, .tokens = 2, .decode = true}}};
    EXPECT_THROW(lm.forward_hidden(Tensor::from_ints({5, 6}, {1, 2}), two), Error);  // a decode step is one token
  }
}

// generate's steps after the prompt, and the engine's decodes, are marked as
// decode steps: on a quantized model, six sequences' three more tokens add
// rows to decode's kernels and none to prefill's (unmarked, their 6-row
// products would dequantize every weight for prefill's GEMM).
TEST(Engine, QuantizedDecodeStepsRunDecodesKernels) {
  PretrainedModel model = load_quiet(quantized_dir("gptq-v1-4b-g128-asym-act"));
  std::vector<std::vector<int64_t>> prompts;
  for (int64_t r = 0; r < 6; ++r) {
    prompts.emplace_back();
    for (int64_t t = 0; t < 5 + r; ++t) prompts.back().push_back((r * 31 + t * 17 + 3) % 250 + 1);
  }
  using ops::detail::quantized_rows_so_far;
  auto rows_of = [](const auto &run) {
    const ops::detail::QuantizedRows before = quantized_rows_so_far();
    run();
    const ops::detail::QuantizedRows after = quantized_rows_so_far();
    return ops::detail::QuantizedRows{after.decode - before.decode, after.prefill - before.prefill};
  };
  auto generated = [&](int64_t tokens) {
    return rows_of([&] { generation::generate(model, prompts, {.max_new_tokens = tokens}); });
  };
  auto served = [&](int64_t tokens) {  // every prompt submitted before the engine starts: one step prefills them all
    return rows_of([&] {
      serving::Engine engine(model, {.max_num_seqs = 6, .max_num_batched_tokens = 128, .max_model_len = 32});
      std::vector<std::shared_ptr<serving::TokenStream>> streams;
      std::thread client;
      if (dist::world_rank() == 0) {
        for (const auto &p : prompts)
          streams.push_back(engine.scheduler().submit({.prompt = p, .max_tokens = tokens}));
        client = std::thread([&] {
          for (auto &s : streams)
            collect(*s);
          engine.scheduler().stop();
        });
      }
      engine.run();
      if (client.joinable())
        client.join();
    });
  };
  for (const auto &[what, run] : {std::pair<std::string, std::function<ops::detail::QuantizedRows(int64_t)>>{"generate", generated},
                                  {"engine", served}}) {
    const ops::detail::QuantizedRows one = run(1), four = run(4);
    EXPECT_EQ(four.prefill, one.prefill) << what;
    EXPECT_GT(four.decode, one.decode) << what;
  }
}

TEST(Engine, BatchedRequestsEqualGenerateAlone) {
  for (const std::string name : {"qwen3", "llama-bf16", "quantized:gptq-v1-4b-g128-asym-act"}) {
    const bool quantized = name.starts_with("quantized:");
    PretrainedModel model =
        load_quiet(quantized ? quantized_dir(name.substr(10)) : tp::testing::model_dir(name));
    const std::vector<Case> cases = {
        {{1, 17, 42, 99, 250, 3, 511}, 9, {}},
        {{7, 300, 12}, 14, {}},
        {{5}, 4, {}},
        {{33, 34, 35, 36, 37, 38, 39, 40, 41, 42, 43, 44, 45, 46, 47, 48, 49,
          50},
         6,
         {}},
        {{8, 9, 10, 11},
         12,
         {.temperature = 0.9, .top_k = 40, .top_p = 0.9, .seed = 5}},
    };
    std::vector<std::vector<int64_t>> want;
    for (const Case &c : cases)
      want.push_back(generation::generate(model, {c.prompt},
                                          {.max_new_tokens = c.max_tokens,
                                           .sampling = c.sampling})
                         .tokens[0]);

    // Three slots for five requests: later ones wait, then reuse freed rows.
    // A step of 64 tokens takes every prompt whole; one of 5 prefills the 7-
    // and 18-token prompts in chunks, beside the running sequences' decodes.
    // Submitted before the engine starts, with steps of 12 tokens, the first
    // three prompts prefill together in the first step, and the 18-token one
    // joins the running decodes later in chunks (each step one packed forward).
    for (const auto [budget, upfront] : {std::pair{64, false}, std::pair{5, false}, std::pair{12, true}}) {
      serving::Engine engine(model, {.max_num_seqs = 3,
                                     .max_num_batched_tokens = budget,
                                     .max_model_len = 48});
      std::vector<std::vector<int64_t>> got(cases.size());
      std::thread client;
      std::vector<std::shared_ptr<serving::TokenStream>> streams;
      auto submit = [&](const Case &c) {
        streams.push_back(engine.scheduler().submit(
            {.prompt = c.prompt, .max_tokens = c.max_tokens, .sampling = c.sampling}));
      };
      if (dist::world_rank() == 0) {
        if (upfront)
          for (const Case &c : cases)
            submit(c);
        client = std::thread([&, upfront] {
          if (!upfront) {
            submit(cases[0]);
            std::vector<int64_t> first;
            while (first.empty())
              streams[0]->wait(first, 100ms); // the others join a running batch
            for (size_t i = 1; i < cases.size(); ++i)
              submit(cases[i]);
            got[0] = first;
          }
          std::vector<int64_t> rest = collect(*streams[0]);
          got[0].insert(got[0].end(), rest.begin(), rest.end());
          for (size_t i = 1; i < cases.size(); ++i)
            got[i] = collect(*streams[i]);
          engine.scheduler().stop();
        });
      }
      engine.run();
      if (client.joinable())
        client.join();
      if (dist::world_rank() == 0) {
        for (size_t i = 0; i < cases.size(); ++i)
          EXPECT_EQ(got[i], want[i]) << name << " request " << i
                                     << ", steps of " << budget << " tokens";
      }
      EXPECT_GT(engine.steps(), 0);
    }
  }
}
