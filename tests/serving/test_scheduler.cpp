// Continuous batching without a model: requests take free slots at the next
// step, decode next to the running ones, end on EOS / max_tokens / cancel and
// give their slot (reset first) to the next request; the token budget holds,
// prompts longer than a step's budget prefilled in chunks;
// plans survive their broadcast encoding.
#include <gtest/gtest.h>

#include "tp/serving/scheduler.h"

using namespace tp::serving;
using namespace std::chrono_literals;

namespace {

GenerationRequest req(std::vector<int64_t> prompt, int64_t max_tokens, std::vector<int64_t> eos = {}) {
  return {.prompt = std::move(prompt), .max_tokens = max_tokens, .sampling = {}, .eos_token_ids = std::move(eos)};
}

std::vector<int64_t> drain(TokenStream& s, StreamEnd* end = nullptr) {
  std::vector<int64_t> out;
  StreamEnd e = s.wait(out, 0ms);
  if (end) *end = e;
  return out;
}

}  // namespace

TEST(Scheduler, JoinsTheRunningBatchAndFreesSlots) {
  Scheduler s({.max_num_seqs = 2, .max_num_batched_tokens = 64, .max_model_len = 32});
  auto a = s.submit(req({1, 2, 3}, 3));
  StepPlan p1 = s.next_step(0ms);
  ASSERT_EQ(p1.prefills.size(), 1u);
  EXPECT_EQ(p1.prefills[0].slot, 0);
  EXPECT_EQ(p1.prefills[0].ids, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_TRUE(p1.decodes.empty());
  s.complete_step(p1, {10}, {});

  // b arrives while a runs: it is prefilled in the step that decodes a.
  auto b = s.submit(req({4}, 5, {99}));
  auto c = s.submit(req({5, 6}, 2));
  StepPlan p2 = s.next_step(0ms);
  ASSERT_EQ(p2.decodes.size(), 1u);
  EXPECT_EQ(p2.decodes[0].slot, 0);
  EXPECT_EQ(p2.decodes[0].token, 10);
  ASSERT_EQ(p2.prefills.size(), 1u);  // two slots: c waits
  EXPECT_EQ(p2.prefills[0].slot, 1);
  EXPECT_EQ(s.waiting(), 1);
  EXPECT_EQ(s.generated(0), 1);
  s.complete_step(p2, {20}, {11});

  StepPlan p3 = s.next_step(0ms);
  ASSERT_EQ(p3.decodes.size(), 2u);
  s.complete_step(p3, {}, {12, 99});  // a reaches max_tokens, b its EOS
  StreamEnd end;
  EXPECT_EQ(drain(*a, &end), (std::vector<int64_t>{10, 11, 12}));
  EXPECT_EQ(end, StreamEnd::Length);
  EXPECT_EQ(drain(*b, &end), (std::vector<int64_t>{20, 99}));
  EXPECT_EQ(end, StreamEnd::Eos);
  EXPECT_EQ(s.running(), 0);

  // Both rows are reset before c reuses slot 0.
  StepPlan p4 = s.next_step(0ms);
  EXPECT_EQ(p4.resets, (std::vector<int64_t>{0, 1}));
  ASSERT_EQ(p4.prefills.size(), 1u);
  EXPECT_EQ(p4.prefills[0].slot, 0);
  EXPECT_EQ(s.generated(0), 0);
}

TEST(Scheduler, CancelledReadersFreeTheirSlot) {
  Scheduler s({.max_num_seqs = 1, .max_num_batched_tokens = 64, .max_model_len = 32});
  auto a = s.submit(req({1}, 10));
  auto b = s.submit(req({2}, 10));
  auto c = s.submit(req({3}, 10));
  StepPlan p = s.next_step(0ms);
  s.complete_step(p, {7}, {});
  a->cancel();
  b->cancel();  // still waiting: dropped without running
  StepPlan q = s.next_step(0ms);
  EXPECT_EQ(q.resets, (std::vector<int64_t>{0}));
  EXPECT_TRUE(q.decodes.empty());
  ASSERT_EQ(q.prefills.size(), 1u);
  EXPECT_EQ(q.prefills[0].ids, (std::vector<int64_t>{3}));
  StreamEnd end;
  drain(*a, &end);
  EXPECT_EQ(end, StreamEnd::Cancelled);
  drain(*b, &end);
  EXPECT_EQ(end, StreamEnd::Cancelled);
}

TEST(Scheduler, TokenBudgetChunksPrompts) {
  // vLLM's chunked prefill: decodes first, then the prompt in progress, then new
  // ones, never more than max_num_batched_tokens tokens in a step.
  Scheduler s({.max_num_seqs = 4, .max_num_batched_tokens = 10, .max_model_len = 32});
  auto a = s.submit(req({1, 2, 3, 4, 5, 6}, 2));
  auto b = s.submit(req({11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23}, 2));  // longer than a step
  StepPlan p = s.next_step(0ms);
  ASSERT_EQ(p.prefills.size(), 2u);
  EXPECT_EQ(p.prefills[0].ids, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_TRUE(p.prefills[0].last);
  EXPECT_EQ(p.prefills[1].ids, (std::vector<int64_t>{11, 12, 13, 14}));  // what is left of the 10
  EXPECT_FALSE(p.prefills[1].last);
  s.complete_step(p, {7}, {});  // a token only for the prompt that ended
  EXPECT_EQ(drain(*a), (std::vector<int64_t>{7}));
  EXPECT_TRUE(drain(*b).empty());
  auto c = s.submit(req({31, 32, 33}, 1));
  StepPlan q = s.next_step(0ms);  // a decodes; b goes on with 9; c waits for the budget
  ASSERT_EQ(q.decodes.size(), 1u);
  EXPECT_EQ(q.decodes[0].token, 7);
  ASSERT_EQ(q.prefills.size(), 1u);
  EXPECT_EQ(q.prefills[0].slot, p.prefills[1].slot);
  EXPECT_EQ(q.prefills[0].ids, (std::vector<int64_t>{15, 16, 17, 18, 19, 20, 21, 22, 23}));
  EXPECT_TRUE(q.prefills[0].last);
  s.complete_step(q, {24}, {8});  // a ends (max_tokens 2); b has its first token
  EXPECT_EQ(drain(*b), (std::vector<int64_t>{24}));
  StepPlan r = s.next_step(0ms);  // b decodes; c's whole prompt fits
  EXPECT_EQ(r.decodes.size(), 1u);
  ASSERT_EQ(r.prefills.size(), 1u);
  EXPECT_EQ(r.prefills[0].ids, (std::vector<int64_t>{31, 32, 33}));
  EXPECT_EQ(r.resets.size(), 1u);  // a's row, before c can take it
  // A prompt longer than a step is accepted; one over the context is not.
  EXPECT_NO_THROW(s.submit(req(std::vector<int64_t>(20, 1), 1)));
  EXPECT_THROW(s.submit(req(std::vector<int64_t>(30, 1), 7)), tp::Error);  // 37 > max_model_len
  EXPECT_THROW(s.submit(req({}, 1)), tp::Error);
}

TEST(Scheduler, CancelledWhilePrefillingFreesTheSlot) {
  Scheduler s({.max_num_seqs = 1, .max_num_batched_tokens = 4, .max_model_len = 32});
  auto a = s.submit(req(std::vector<int64_t>(10, 1), 3));
  StepPlan p = s.next_step(0ms);
  ASSERT_EQ(p.prefills.size(), 1u);
  EXPECT_FALSE(p.prefills[0].last);
  s.complete_step(p, {}, {});
  a->cancel();
  auto b = s.submit(req({5, 6}, 1));
  StepPlan q = s.next_step(0ms);  // a's slot is reset and given to b, whose prompt starts over on it
  StreamEnd end;
  drain(*a, &end);
  EXPECT_EQ(end, StreamEnd::Cancelled);
  EXPECT_EQ(q.resets, (std::vector<int64_t>{0}));
  ASSERT_EQ(q.prefills.size(), 1u);
  EXPECT_EQ(q.prefills[0].ids, (std::vector<int64_t>{5, 6}));
  EXPECT_TRUE(q.prefills[0].last);
}

TEST(Scheduler, StopEndsEveryStream) {
  Scheduler s({.max_num_seqs = 1, .max_num_batched_tokens = 8, .max_model_len = 8});
  auto a = s.submit(req({1}, 4));
  StepPlan p = s.next_step(0ms);
  s.complete_step(p, {2}, {});
  auto b = s.submit(req({1}, 4));
  s.stop();
  EXPECT_TRUE(s.next_step(0ms).stop);
  StreamEnd end;
  drain(*a, &end);
  EXPECT_EQ(end, StreamEnd::Shutdown);
  drain(*b, &end);
  EXPECT_EQ(end, StreamEnd::Shutdown);
  drain(*s.submit(req({1}, 1)), &end);
  EXPECT_EQ(end, StreamEnd::Shutdown);
}

TEST(StepPlan, EncodesAndDecodes) {
  StepPlan p;
  p.resets = {2, 0};
  p.prefills = {{1, {5, 6, 7}, false}, {3, {9}}};
  p.decodes = {{0, 11}, {2, 12}};
  StepPlan q = StepPlan::decode(p.encode());
  EXPECT_EQ(q.resets, p.resets);
  ASSERT_EQ(q.prefills.size(), 2u);
  EXPECT_EQ(q.prefills[0].ids, (std::vector<int64_t>{5, 6, 7}));
  EXPECT_FALSE(q.prefills[0].last);
  EXPECT_EQ(q.prefills[1].slot, 3);
  EXPECT_TRUE(q.prefills[1].last);
  ASSERT_EQ(q.decodes.size(), 2u);
  EXPECT_EQ(q.decodes[1].token, 12);
  EXPECT_FALSE(q.stop);
  StepPlan stop;
  stop.stop = true;
  EXPECT_TRUE(StepPlan::decode(stop.encode()).stop);
  EXPECT_THROW(StepPlan::decode({0, 5, 1}), tp::Error);
}
