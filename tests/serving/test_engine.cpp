// The batch engine (every rank runs it; rank 0 takes requests from another
// thread, as the HTTP handlers do): requests that arrive while others run join
// the batch, and each one's tokens equal generate()'s for its prompt alone,
// greedy or seeded, at tp = 1 and 2, with whole prompts and with prompts
// prefilled in chunks.
#include <gtest/gtest.h>

#include <thread>

#include "distributed/dist_test_util.h"
#include "models/model_test_util.h"
#include "tp/distributed/process_group.h"
#include "tp/generation/generate.h"
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

TEST(Engine, BatchedRequestsEqualGenerateAlone) {
  for (const std::string name : {"qwen3", "llama-bf16"}) {
    LoadOptions o;
    o.verbose = false;
    PretrainedModel model =
        AutoModelForCausalLM::from_pretrained(tp::testing::model_dir(name), o);
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
