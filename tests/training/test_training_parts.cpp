// The Trainer's parts on one process: Transformers' schedules and no-decay rule,
// torch's AdamW and SGD element for element, the causal-LM loss (shift, ignore
// index, normalizer) against ops::cross_entropy, the data pipeline (documents,
// EOS, packing, JSON lines, the seeded order), the arguments' errors, and the
// routers' load-balancing loss against Transformers' formula.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>

#include "tokenizer/test_util.h"
#include "tp/autograd/tape.h"
#include "tp/nn/layers.h"
#include "tp/ops/elementwise.h"
#include "tp/ops/loss.h"
#include "tp/ops/shape.h"
#include "tp/training/data.h"
#include "tp/training/loss.h"
#include "tp/training/optimizer.h"
#include "tp/training/schedule.h"
#include "tp/training/trainer.h"

using namespace tp;
using namespace tp::training;

namespace {

namespace fs = std::filesystem;

void expect_error(const std::function<void()>& f, const std::vector<std::string>& words) {
  try {
    f();
    ADD_FAILURE() << "no error; expected one mentioning " << words.front();
  } catch (const Error& e) {
    for (const std::string& w : words) EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  }
}

}  // namespace

TEST(Schedule, TransformersFormulas) {
  // Warmup 4 of 20 steps: s / 4, then each schedule's formula over the 16 left.
  for (int64_t s = 0; s < 4; ++s)
    for (ScheduleType t : {ScheduleType::Linear, ScheduleType::Cosine, ScheduleType::Constant})
      EXPECT_DOUBLE_EQ(lr_factor(t, s, 4, 20), s / 4.0);
  EXPECT_DOUBLE_EQ(lr_factor(ScheduleType::Linear, 4, 4, 20), 1.0);
  EXPECT_DOUBLE_EQ(lr_factor(ScheduleType::Linear, 12, 4, 20), 0.5);
  EXPECT_DOUBLE_EQ(lr_factor(ScheduleType::Linear, 20, 4, 20), 0.0);
  EXPECT_DOUBLE_EQ(lr_factor(ScheduleType::Cosine, 12, 4, 20), 0.5);
  EXPECT_NEAR(lr_factor(ScheduleType::Cosine, 8, 4, 20), 0.5 * (1 + std::cos(M_PI * 0.25)), 1e-15);
  EXPECT_DOUBLE_EQ(lr_factor(ScheduleType::Constant, 17, 4, 20), 1.0);
  // No warmup: step 0 has the full rate (Transformers' linear: (T - 0) / T).
  EXPECT_DOUBLE_EQ(lr_factor(ScheduleType::Linear, 0, 0, 10), 1.0);
  EXPECT_EQ(parse_schedule("constant_with_warmup"), ScheduleType::Constant);
  expect_error([] { parse_schedule("wavy"); }, {"'wavy'", "linear", "cosine", "constant"});
}

TEST(NoDecay, TransformersNamePatterns) {
  for (const char* name : {"model.layers.0.input_layernorm.weight", "model.layers.3.post_attention_layernorm.weight",
                           "model.norm.weight", "model.layers.0.self_attn.q_norm.weight",
                           "model.layers.0.self_attn.k_norm.weight", "model.layers.0.self_attn.q_proj.bias",
                           "transformer.ln_f.RMSNorm.weight"})
    EXPECT_FALSE(decays(name)) << name;
  for (const char* name : {"model.embed_tokens.weight", "lm_head.weight", "model.layers.0.mlp.down_proj.weight",
                           "model.layers.0.self_attn.o_proj.weight", "model.normalizer.weight"})
    EXPECT_TRUE(decays(name)) << name;
}

TEST(Optimizer, AdamWIsTorchsFormulaAndSgdWithMomentum) {
  for (const std::string optim : {"adamw", "sgd"}) {
    // 5 x 13 = 65 elements: four 16-wide vector iterations and a scalar tail. Embeddings are decayed.
    constexpr int kN = 65;
    nn::Embedding e("model.embed_tokens", 5, 13);
    e.weight.data = Tensor::randn({5, 13}, 1);
    auto group = dist::world().split(dist::world_rank(), 0);
    ModelParameters params(e, *group, false);
    std::vector<float> w = params.params()[0].master.to_vector(), m(kN, 0), v(kN, 0), b(kN, 0);
    const double lr = 0.01, wd = 0.1, b1 = 0.9, b2 = 0.999, eps = 1e-8;
    std::unique_ptr<Optimizer> opt;
    if (optim == "adamw") opt = std::make_unique<AdamW>(params, AdamWOptions{b1, b2, eps, wd});
    else opt = std::make_unique<SGD>(params, SGDOptions{0.9, wd});
    for (int t = 1; t <= 3; ++t) {
      Tensor g = Tensor::randn({5, 13}, 10 + t);
      params.params()[0].grad.copy_from(g);
      std::vector<float> gs = g.to_vector();
      opt->step(lr, 0.5f);  // a clip coefficient of 0.5, fused
      for (int i = 0; i < kN; ++i) {
        const double gi = gs[i] * 0.5;
        if (optim == "adamw") {
          w[i] *= 1 - lr * wd;
          m[i] = b1 * m[i] + (1 - b1) * gi;
          v[i] = b2 * v[i] + (1 - b2) * gi * gi;
          w[i] -= lr / (1 - std::pow(b1, t)) * m[i] / (std::sqrt(v[i]) / std::sqrt(1 - std::pow(b2, t)) + eps);
        } else {
          const double d = gi + wd * w[i];
          b[i] = t == 1 ? d : 0.9 * b[i] + d;
          w[i] -= lr * b[i];
        }
      }
    }
    std::vector<float> got = params.params()[0].master.to_vector();
    for (int i = 0; i < kN; ++i) EXPECT_NEAR(got[i], w[i], 1e-6 * (1 + std::abs(w[i]))) << optim << " element " << i;
    EXPECT_EQ(opt->steps(), 3);
  }
}

TEST(Loss, CausalLmLossShiftsIgnoresAndNormalizes) {
  Tensor logits = Tensor::randn({2, 5, 7}, 3);
  Tensor labels = Tensor::from_ints({1, 2, 3, -100, 4, 0, 6, -100, -100, 5}, {2, 5});
  // Targets: labels[:, 1:] that are not -100: 2, 3, 4 (row 0) and 6, 5 (row 1).
  EXPECT_EQ(count_targets(labels), 5);
  Tensor x = logits.clone();
  x.set_requires_grad(true);
  Tensor loss = causal_lm_loss(x, labels, 10.0, {0, 7, nullptr});  // normalizer: 10, not the 5 here
  // The same through ops::cross_entropy on the shifted rows (a mean over 5, so x 5 / 10).
  Tensor y = logits.clone();
  y.set_requires_grad(true);
  Tensor rows = ops::reshape(ops::narrow(y, 1, 0, 4), {8, 7});
  Tensor shifted = Tensor::from_ints({2, 3, -100, 4, 6, -100, -100, 5}, {8});
  Tensor want = ops::scale(ops::cross_entropy(rows, shifted), 5.0 / 10.0);
  EXPECT_NEAR(loss.item(), want.item(), 1e-6);
  autograd::backward(loss);
  autograd::backward(want);
  EXPECT_LE(max_abs_diff(x.grad(), y.grad()), 1e-6);
  // The last position of every row predicts nothing: no gradient there.
  EXPECT_EQ(max_abs(x.grad().narrow(1, 4, 1)), 0.0);
  expect_error([&] { causal_lm_loss(logits, Tensor::from_ints({1, 9, 3, 4, 5, 0, 1, 2, 3, 4}, {2, 5}), 1.0, {0, 7, nullptr}); },
               {"label 9", "outside the vocabulary [0, 7)"});
}

TEST(Data, DocumentsTokenizedWithEosBetweenThemAndPackedIntoBlocks) {
  const fs::path dir = fs::temp_directory_path() / "tp-test-data";
  fs::create_directories(dir);
  const Tokenizer tok = Tokenizer::from_file(test::tokenizer_test_dir() / "data/tiny/tokenizer.json");
  const int64_t eos = tok.eos_token_ids().at(0), bos = *tok.bos_token_id();
  {
    std::ofstream(dir / "a.txt") << "ab cd\n\nef\n";
    std::ofstream(dir / "b.jsonl") << "{\"text\": \"ab cd\"}\n\n{\"text\": \"ef\"}\n";
  }
  std::vector<int32_t> want;
  for (const char* doc : {"ab cd", "ef"}) {
    for (int64_t id : tok.encode(doc)) want.push_back(static_cast<int32_t>(id));
    want.push_back(static_cast<int32_t>(eos));
  }
  EXPECT_EQ(want.front(), bos) << "the tokenizer's post-processor adds its BOS to each document";
  for (const char* file : {"a.txt", "b.jsonl"}) {
    TokenBlocks lines = TokenBlocks::from_files({dir / file}, tok, {.seq_len = 2});
    EXPECT_EQ(lines.documents(), 2) << file;
    EXPECT_EQ(lines.num_tokens() + lines.dropped_tokens(), static_cast<int64_t>(want.size())) << file;
    std::vector<int64_t> all;
    for (int64_t b = 0; b < lines.size(); ++b)
      for (int64_t t : lines.batch({b}).to_int_vector()) all.push_back(t);
    for (size_t i = 0; i < all.size(); ++i) EXPECT_EQ(all[i], want[i]) << file << " token " << i;
  }
  std::ofstream(dir / "p.txt") << "ab\ncd\n\nef\n";
  EXPECT_EQ(TokenBlocks::from_files({dir / "p.txt"}, tok, {.seq_len = 2, .sample_by = "paragraph"}).documents(), 2);
  EXPECT_EQ(TokenBlocks::from_files({dir / "p.txt"}, tok, {.seq_len = 2, .sample_by = "document"}).documents(), 1);
  EXPECT_EQ(TokenBlocks::from_files({dir / "p.txt"}, tok, {.seq_len = 2}).documents(), 3);
  std::ofstream(dir / "bad.jsonl") << "{\"text\": \"ok\"}\n{\"txt\": \"no\"}\n";
  expect_error([&] { TokenBlocks::from_files({dir / "bad.jsonl"}, tok, {.seq_len = 2}); },
               {"bad.jsonl:2", "\"text\""});
  expect_error([&] { TokenBlocks::from_files({dir / "a.txt"}, tok, {.seq_len = 1000}); },
               {"a.txt", "fewer than one block of seq_len 1000"});
  expect_error([&] { TokenBlocks::from_files({dir / "p.txt"}, tok, {.seq_len = 2, .sample_by = "word"}); },
               {"'word'", "line, paragraph, document"});
}

TEST(Data, EpochOrderIsASeededPermutationTheSameEverywhere) {
  std::vector<int64_t> a = epoch_order(1000, 42, 0), b = epoch_order(1000, 42, 0), c = epoch_order(1000, 42, 1),
                       d = epoch_order(1000, 43, 0);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c) << "each epoch has its own order";
  EXPECT_NE(a, d) << "the seed changes it";
  std::set<int64_t> seen(a.begin(), a.end());
  EXPECT_EQ(seen.size(), 1000u);
  EXPECT_EQ(*seen.begin(), 0);
  EXPECT_EQ(*seen.rbegin(), 999);
  // Pinned: a checkpoint's data position means this order; it must not change between versions.
  EXPECT_EQ(std::vector<int64_t>(a.begin(), a.begin() + 6), (std::vector<int64_t>{867, 89, 751, 411, 517, 194}));
  std::vector<int64_t> identity(10);
  std::iota(identity.begin(), identity.end(), 0);
  EXPECT_EQ(epoch_order(10, 42, 0, false), identity);
}

TEST(Arguments, EveryBadValueIsNamed) {
  auto bad = [](auto set, std::vector<std::string> words) {
    TrainingArguments a;
    set(a);
    expect_error([&] { a.validate(); }, words);
  };
  bad([](TrainingArguments& a) { a.learning_rate = 0; }, {"learning_rate must be > 0, got 0"});
  bad([](TrainingArguments& a) { a.learning_rate = -1e-3; }, {"learning_rate", "-0.001"});
  bad([](TrainingArguments& a) { a.per_device_train_batch_size = 0; }, {"per_device_train_batch_size", "0"});
  bad([](TrainingArguments& a) { a.gradient_accumulation_steps = 0; }, {"gradient_accumulation_steps"});
  bad([](TrainingArguments& a) { a.max_steps = 0; }, {"max_steps"});
  bad([](TrainingArguments& a) { a.adam_beta2 = 1.0; }, {"adam_beta2", "[0, 1)"});
  bad([](TrainingArguments& a) { a.optim = "lion"; }, {"'lion'", "adamw_torch", "sgd"});
  bad([](TrainingArguments& a) { a.lr_scheduler_type = "step"; }, {"'step'"});
  bad([](TrainingArguments& a) { a.eval_strategy = "epoch"; }, {"eval_strategy 'epoch'", "no, steps"});
  bad([](TrainingArguments& a) { a.save_total_limit = 0; }, {"save_total_limit"});
  TrainingArguments ok;
  EXPECT_NO_THROW(ok.validate());
  EXPECT_EQ(ok.learning_rate, 5e-5);
  EXPECT_EQ(ok.weight_decay, 0.0);
  EXPECT_EQ(ok.max_grad_norm, 1.0);
  EXPECT_EQ(ok.lr_scheduler_type, "linear");
  EXPECT_EQ(ok.seed, 42);
  EXPECT_EQ(ok.per_device_train_batch_size, 8);
}

