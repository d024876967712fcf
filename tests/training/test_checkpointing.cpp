// Activation checkpointing changes what is kept, not the numbers: at tp = world
// size (CTest runs 1, 2 and 4 ranks) a model trained with gradient_checkpointing
// (full, selective, every second layer; under bf16, LoRA with dropout, sequence
// parallelism and MoE routers with their aux loss) gives bitwise the losses,
// gradient norms, gradients and updated weights of the same model without it.
// A recompute that skipped an op, replayed a kept output out of order or drew
// another dropout mask would change bits.
//
// The fused, chunked lm_head + cross-entropy (causal_lm_loss_from_hidden) against
// lm_head's GEMM then causal_lm_loss, vocab-parallel at tp > 1: the same loss and
// gradients to 1e-6, in f32, bf16 and bf16-valued f32 arithmetic, over several chunks.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "autograd/recording_leaf_by_rows.h"
#include "models/model_test_util.h"
#include "training/training_test_util.h"
#include "tp/autograd/tape.h"
#include "tp/models/auto.h"
#include "tp/ops/linear.h"
#include "tp/training/lora_training.h"
#include "tp/training/loss.h"
#include "tp/training/trainer.h"

using namespace tp;
using namespace tp::training;
using tp::testing::expect_close_rel;
using tp::testing::model_dir;

namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct Case {
  std::string name;
  std::string model;
  json kwargs;  // gradient_checkpointing_kwargs
  bool bf16 = false;
  bool sequence_parallel = false;
  bool lora = false;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) { return info.param.name; }
void PrintTo(const Case& c, std::ostream* out) { *out << c.name; }

PretrainedModel load(const Case& c) {
  LoadOptions o = LoadOptions::for_training();
  o.verbose = false;
  o.distributed_config.enable_sequence_parallel = c.sequence_parallel;
  return AutoModelForCausalLM::from_pretrained(model_dir(c.model), o);
}

TrainingArguments args_for(const Case& c, bool checkpointing) {
  TrainingArguments a;
  a.output_dir = (fs::temp_directory_path() / ("tp-test-ckpt-" + std::to_string(::getppid())) /
                  (c.name + (checkpointing ? "-on" : "-off")))
                     .string();
  a.learning_rate = 2e-3;
  a.warmup_steps = 1;
  a.per_device_train_batch_size = 2;
  a.save_strategy = "no";
  a.bf16 = c.bf16;
  a.gradient_checkpointing = checkpointing;
  if (checkpointing) a.gradient_checkpointing_kwargs = c.kwargs;
  return a;
}

struct TrainingRun {
  PretrainedModel model;
  std::optional<LoraModel> lora;
  std::unique_ptr<Trainer> trainer;
};

void start(TrainingRun& r, const Case& c, bool checkpointing, std::shared_ptr<const TokenBlocks> data) {
  TrainerOptions options;
  if (c.lora) {
    LoraConfig config;
    config.r = 4;
    config.lora_alpha = 8;
    config.lora_dropout = 0.25;  // masks drawn in the forward must be drawn again in the recompute
    config.target_modules = {"q_proj", "v_proj", "down_proj"};
    r.lora = apply_lora(r.model, config, peft_init(7));
    options = adapter_training(r.model, *r.lora);
  }
  r.trainer = std::make_unique<Trainer>(r.model, args_for(c, checkpointing), data, nullptr, options);
}

class Checkpointing : public ::testing::TestWithParam<Case> {};

}  // namespace

TEST_P(Checkpointing, LossesGradientsAndWeightsAreBitwiseThoseWithout) {
  const Case& c = GetParam();
  auto data = tp::testing::synthetic_data(516, 8, 12);
  TrainingRun off{load(c)}, on{load(c)};
  start(off, c, false, data);
  start(on, c, true, data);
  ASSERT_TRUE(on.model.lm().gradient_checkpointing().enabled);
  ASSERT_FALSE(off.model.lm().gradient_checkpointing().enabled);
  for (int64_t step = 0; step < 2; ++step) {
    std::vector<int64_t> blocks = {(2 * step) % data->size(), (2 * step + 1) % data->size()};
    Tensor ids = data->batch(blocks);
    StepResult a = off.trainer->training_step({{ids, ids}});
    StepResult b = on.trainer->training_step({{ids, ids}});
    EXPECT_EQ(b.loss, a.loss) << c.name << " loss at step " << step;
    EXPECT_EQ(b.aux_loss, a.aux_loss) << c.name << " aux loss at step " << step;
    EXPECT_EQ(b.grad_norm, a.grad_norm) << c.name << " grad norm at step " << step;
    for (const TrainableParam& q : on.trainer->parameters().params()) {
      const TrainableParam& p = off.trainer->parameters().find(q.name);
      EXPECT_TRUE(equal(q.grad, p.grad)) << c.name << " gradient of " << q.name << " at step " << step << " (max diff "
                                         << max_abs_diff(q.grad, p.grad) << ")";
    }
  }
  EXPECT_TRUE(equal(on.trainer->parameters().full_masters(), off.trainer->parameters().full_masters()))
      << c.name << ": the updated weights differ";
  EXPECT_EQ(autograd::tape_size(), 0u) << "the checkpoints' recomputes left entries on the tape";
}

INSTANTIATE_TEST_SUITE_P(
    Policies, Checkpointing,
    ::testing::Values(Case{"llama_full", "llama", json::object()},
                      Case{"llama_selective", "llama", {{"policy", "selective"}}},
                      Case{"qwen3_full_bf16", "qwen3", {{"policy", "full"}}, true},
                      Case{"qwen3_selective_bf16", "qwen3", {{"policy", "selective"}}, true},
                      Case{"qwen3_every_2nd", "qwen3", {{"every_n_layers", 2}, {"use_reentrant", false}}},
                      Case{"qwen3_full_sequence_parallel", "qwen3", json::object(), false, true},
                      Case{"qwen3_selective_sequence_parallel", "qwen3", {{"policy", "selective"}}, true, true},
                      Case{"llama_lora_dropout_full", "llama", json::object(), false, false, true},
                      Case{"llama_lora_dropout_selective", "llama", {{"policy", "selective"}}, true, false, true},
                      Case{"mixtral_aux_loss_full", "mixtral", json::object()},
                      Case{"qwen3_moe_selective", "qwen3_moe", {{"policy", "selective"}}},
                      Case{"deepseek_v2_full", "deepseek_v2", json::object(), true},
                      Case{"gpt_oss_selective", "gpt_oss", {{"policy", "selective"}}}),
    case_name);

TEST(CheckpointingArguments, BadOptionsAreErrorsNamingThem) {
  TrainingArguments a;
  a.gradient_checkpointing = true;
  auto message = [&](json kwargs) {
    a.gradient_checkpointing_kwargs = kwargs;
    try {
      a.validate();
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({{"policy", "op"}}).find("policy \"op\" is not supported; supported: \"full\", \"selective\""),
            std::string::npos);
  EXPECT_NE(message({{"every_n_layers", 0}}).find("every_n_layers must be an integer >= 1, got 0"), std::string::npos);
  EXPECT_NE(message({{"preserve_rng_state", true}}).find("'preserve_rng_state' is not supported"), std::string::npos);
  EXPECT_NE(message(json::array()).find("must be a JSON object"), std::string::npos);
  a.gradient_checkpointing = false;
  EXPECT_NE(message({{"policy", "full"}}).find("without gradient_checkpointing"), std::string::npos);
  EXPECT_EQ(message(json::object()), "no error");
}

namespace {

struct LossCase {
  std::string name;
  DType w_dtype;
  std::optional<DType> compute;
};

class FusedLoss : public ::testing::TestWithParam<LossCase> {};

}  // namespace

// tp ranks each hold a slice of lm_head's rows (the vocab, uneven at 4 ranks: 37 =
// 10 + 9 + 9 + 9); the reference is the same rows' GEMM and causal_lm_loss.
TEST_P(FusedLoss, EqualsTheGemmThenTheLoss) {
  const LossCase& c = GetParam();
  dist::ProcessGroup& world = dist::world();
  const int64_t B = 2, T = 9, H = 16, V = 37;
  const ChunkSpan rows = chunk_span(V, world.size(), world.rank());
  Tensor w_full = Tensor::randn({V, H}, 3, 0, 0.3f);
  if (c.compute == DType::BF16 && c.w_dtype == DType::F32) w_full = w_full.to(DType::BF16).to(DType::F32);
  Tensor w = w_full.narrow(0, rows.offset, rows.size).clone().to(c.w_dtype);
  std::vector<int64_t> label_values;
  for (int64_t i = 0; i < B * T; ++i) label_values.push_back(i % 7 == 3 ? -100 : (i * 5 + 1) % V);
  Tensor labels = Tensor::from_ints(label_values, {B, T});
  const VocabSlice vocab{rows.offset, V, &world};
  // sink_rows > 0: lm_head held by blocks of that many rows (FSDP's root).
  auto run = [&](bool fused, int64_t chunk_bytes, int64_t sink_rows = 0) {
    Tensor h = Tensor::randn({B, T, H}, 5);
    h.set_requires_grad(true);
    Tensor wl = w.clone();
    wl.set_requires_grad(true);
    auto sink = sink_rows > 0 ? std::make_shared<tp::testing::RecordingLeafByRows>(wl, sink_rows) : nullptr;
    if (sink) autograd::set_leaf_by_rows(wl, sink);
    Tensor loss = fused ? causal_lm_loss_from_hidden(h, wl, c.compute, labels, 11.0, vocab, -100, chunk_bytes)
                        : causal_lm_loss(ops::linear(h, wl, Tensor(), c.compute), labels, 11.0, vocab);
    autograd::backward(loss);
    if (sink) {
      const int64_t blocks = (w.size(0) + sink_rows - 1) / sink_rows;
      EXPECT_EQ(sink->blocks, blocks) << c.name << ": a gradient block each";
      EXPECT_EQ(sink->reads, fused ? 2 * blocks : 0) << c.name << ": each block read by the forward and the backward";
    }
    return std::make_tuple(loss.item(), h.grad(), sink ? sink->whole : wl.grad());
  };
  const auto [loss, dh, dw] = run(false, 0);
  // 4 rows of logits per chunk (4 x 10 floats): 5 chunks, the last one short; and one chunk for everything.
  for (int64_t chunk_bytes : {int64_t{4 * 10 * 4}, int64_t{1} << 20}) {
    const auto [fused_loss, fused_dh, fused_dw] = run(true, chunk_bytes);
    tp::testing::expect_near_rel(fused_loss, loss, 1e-6, c.name + " loss");
    expect_close_rel(fused_dh, dh, 1e-6, c.name + " hidden's gradient");
    expect_close_rel(fused_dw, dw, 1e-6, c.name + " lm_head's gradient");
  }
  // lm_head held by blocks of 3 rows (the last one short; the online softmax
  // over them), over several token chunks, against the GEMM's whole f32 gradient
  // handed over the same way (a bf16 leaf's own gradient is rounded to bf16).
  // Blocks of 10 rows: one block on every rank (10, 9, 9, 9 at tp 4), the plain softmax.
  const Tensor whole_dw = std::get<2>(run(false, 0, 3));
  for (int64_t block : {3, 10}) {
    const std::string what = c.name + " by blocks of " + std::to_string(block) + " rows: ";
    const auto [sunk_loss, sunk_dh, sunk_dw] = run(true, 4 * 10 * 4, block);
    tp::testing::expect_near_rel(sunk_loss, loss, 1e-6, what + "loss");
    expect_close_rel(sunk_dh, dh, 1e-6, what + "hidden's gradient");
    expect_close_rel(sunk_dw, whole_dw, 1e-6, what + "lm_head's gradient");
  }
}

INSTANTIATE_TEST_SUITE_P(Arithmetic, FusedLoss,
                         ::testing::Values(LossCase{"f32", DType::F32, std::nullopt},
                                           LossCase{"bf16_weight", DType::BF16, std::nullopt},
                                           LossCase{"bf16_values", DType::F32, DType::BF16}),
                         [](const auto& info) { return info.param.name; });

// The Trainer takes the fused path (at tp = 1 too), and its losses are the gathered-logits path's.
TEST(FusedLoss, TrainerUsesItAndMatchesTheLogitsPath) {
  auto data = tp::testing::synthetic_data(516, 4, 12);
  Case c{"fused", "qwen3", json::object()};
  PretrainedModel fused_model = load(c), logits_model = load(c);
  Trainer fused(fused_model, args_for(c, false), data);
  TrainingArguments gathered_args = args_for(c, false);
  gathered_args.loss_parallel = false;  // the logits all-gathered at tp > 1: the unfused loss
  gathered_args.output_dir += "-gathered";
  Trainer gathered(logits_model, gathered_args, data);
  EXPECT_TRUE(fused.fused_loss());
  EXPECT_EQ(gathered.fused_loss(), dist::world_size() == 1);
  Tensor ids = data->batch({0, 1});
  StepResult a = fused.training_step({{ids, ids}}), b = gathered.training_step({{ids, ids}});
  tp::testing::expect_near_rel(a.loss, b.loss, 1e-6, "loss");
  tp::testing::expect_near_rel(a.grad_norm, b.grad_norm, 1e-5, "grad norm");
}
