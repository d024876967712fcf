// FSDP (TrainingArguments.fsdp) on 4 ranks against dp_replicate with the same
// global batch: dp_shard 2 x tp 2, dp_shard 4, and dp_replicate 2 x dp_shard 2
// (HSDP), resharded after the forward or not, f32 and bf16, with activation
// checkpointing (bitwise, and no layer gathered twice), with LoRA, and a
// checkpoint saved under FSDP resumed under dp_replicate. Between steps no unit
// is gathered, during one at most one layer besides the root, and each rank keeps
// 1/dp_shard of the masters, gradients and optimizer state.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "models/model_test_util.h"
#include "training/training_test_util.h"
#include "tp/distributed/parallelism_config.h"
#include "tp/models/auto.h"
#include "tp/ops/gemm.h"
#include "tp/training/fsdp.h"
#include "tp/training/lora_training.h"
#include "tp/training/trainer.h"

using namespace tp;
using namespace tp::training;
using tp::testing::expect_close_rel;
using tp::testing::expect_near_rel;
using tp::testing::model_dir;

namespace {

namespace fs = std::filesystem;

constexpr int64_t kSeq = 16, kAccum = 2, kBlocks = 14, kSteps = 8;

struct Layout {
  const char* name;
  int64_t dp_replicate, dp_shard, tp;
};

std::shared_ptr<const dist::DeviceMesh> mesh_for(const Layout& l) {
  return dist::ParallelismConfig{l.dp_replicate, l.dp_shard, l.tp}.build_device_mesh();
}

PretrainedModel load(const std::string& name, const Layout& l) {
  LoadOptions o = LoadOptions::for_training();
  o.verbose = false;
  o.mesh = mesh_for(l);
  return AutoModelForCausalLM::from_pretrained(model_dir(name), o);
}

std::string out_dir(const std::string& test) {
  return (fs::temp_directory_path() / ("tp-test-fsdp-" + std::to_string(::getppid())) / test).string();
}

TrainingArguments args_for(const std::string& test, const std::string& fsdp = "") {
  TrainingArguments a;
  a.output_dir = out_dir(test + (fsdp.empty() ? "" : "-fsdp"));
  a.learning_rate = 2e-3;
  a.weight_decay = 0.1;
  a.warmup_steps = 3;
  a.lr_scheduler_type = "cosine";
  a.max_grad_norm = 1.0;
  a.per_device_train_batch_size = 1;
  a.gradient_accumulation_steps = kAccum;
  a.logging_steps = 1;
  a.save_strategy = "no";
  a.max_steps = kSteps;
  a.fsdp = fsdp;
  return a;
}

std::shared_ptr<TokenBlocks> data() { return tp::testing::synthetic_data(516, kBlocks, kSeq); }

void expect_same_curve(const Trainer& got, const Trainer& want, const std::string& what, double tol,
                       int64_t from_step = 1) {
  std::map<int64_t, nlohmann::json> by_step;
  for (const auto& e : want.state().log_history)
    if (e.contains("loss")) by_step[e["step"].get<int64_t>()] = e;
  int64_t compared = 0;
  for (const auto& e : got.state().log_history) {
    if (!e.contains("loss") || e["step"].get<int64_t>() < from_step) continue;
    const int64_t step = e["step"].get<int64_t>();
    ASSERT_TRUE(by_step.count(step)) << what << ": step " << step;
    expect_near_rel(e["loss"].get<double>(), by_step[step]["loss"].get<double>(), tol,
                    what + " loss at step " + std::to_string(step));
    expect_near_rel(e["grad_norm"].get<double>(), by_step[step]["grad_norm"].get<double>(), tol,
                    what + " grad norm at step " + std::to_string(step));
    ++compared;
  }
  EXPECT_EQ(compared, kSteps - from_step + 1) << what;
}

void expect_same_weights(Trainer& got, Trainer& want, const std::string& what, double tol) {
  for (const TrainableParam& q : got.parameters().params())
    expect_close_rel(got.parameters().gather_master(q), want.parameters().gather_master(want.parameters().find(q.name)),
                     tol, what + " final " + q.name);
}

// The layout FSDP is measured against: the same ranks, all replicas.
Layout replicated(const Layout& l) { return {"replicated", l.dp_replicate * l.dp_shard, 1, l.tp}; }

const Layout kLayouts[] = {{"dpshard2_tp2", 1, 2, 2}, {"dpshard4", 1, 4, 1}, {"dp2_dpshard2", 2, 2, 1}};

class Fsdp : public ::testing::TestWithParam<std::tuple<Layout, bool>> {
 protected:
  void SetUp() override {
    if (dist::world_size() != 4) GTEST_SKIP() << "the layouts need 4 ranks";
  }
};

void expect_released(Trainer& t, const std::string& what) {
  const ModelParameters& p = t.parameters();
  for (size_t u = 0; u < p.units().size(); ++u) {
    EXPECT_FALSE(p.unit_gathered(u)) << what << ": unit " << p.units()[u].id << " still gathered after the step";
    EXPECT_FALSE(p.unit_grads_live(u)) << what << ": unit " << p.units()[u].id << " still holds its whole gradient";
  }
}

}  // namespace

TEST_P(Fsdp, TrainsAsDpReplicateWithTheSameGlobalBatch) {
  const auto [l, reshard] = GetParam();
  const std::string strategy = reshard ? "full_shard" : "shard_grad_op";
  for (const std::string model : {"llama", "qwen3"}) {
    const std::string what = std::string(l.name) + " " + strategy + " " + model;
    PretrainedModel a = load(model, replicated(l)), b = load(model, l);
    Trainer ddp(a, args_for(what), data());
    Trainer fsdp(b, args_for(what, strategy), data());
    ASSERT_NE(fsdp.fsdp(), nullptr);
    ASSERT_TRUE(fsdp.parameters().fully_sharded());
    const int64_t layers = a.config().num_hidden_layers;
    ASSERT_EQ(static_cast<int64_t>(fsdp.parameters().units().size()), layers + 1) << "a unit per layer and the root";
    // The root's matrices (embedding, lm_head) take their gradients by blocks of
    // 37 rows (vocab 516: 14 blocks, or 7 of a tp rank's 258), not into its buffer.
    const int64_t H = a.config().hidden_size;
    fsdp.fsdp()->set_row_block_bytes(4 * H * 37);
    const ParamUnit& root = fsdp.parameters().units().front();
    ASSERT_LT(root.id, 0);
    int64_t root_vectors = 0;
    for (size_t i = root.first; i < root.last; ++i) {
      const TrainableParam& p = fsdp.parameters().params()[i];
      EXPECT_EQ(p.grad_by_rows, p.grad.dim() == 2) << what << ": " << p.name;
      if (!p.grad_by_rows) root_vectors += p.grad.numel();
    }
    EXPECT_LE(static_cast<int64_t>(root.grad->bytes()), 4 * root_vectors + 64 * 16)
        << what << ": the root's gradient buffer holds its vectors only";
    ddp.train();
    fsdp.train();
    EXPECT_EQ(fsdp.fsdp()->row_buffer_bytes(), 2 * 4 * H * 37) << what << ": a block of weights and one of gradient";
    if (reshard) {
      // One unit's weights and gradient at a time, besides the blocks' buffer.
      int64_t largest = 0;
      for (const ParamUnit& u : fsdp.parameters().units())
        largest = std::max<int64_t>(largest, static_cast<int64_t>(u.compute->bytes() + u.grad->bytes()));
      EXPECT_LE(fsdp.fsdp()->peak_gathered_bytes(), largest + fsdp.fsdp()->row_buffer_bytes()) << what;
    }
    // 14 blocks in global micro-batches of 4: at dp 4 the second step of every
    // epoch leaves two ranks without data, which still run every unit.
    expect_same_curve(fsdp, ddp, what, 1e-5);
    expect_same_weights(fsdp, ddp, what, 1e-5);
    EXPECT_EQ(fsdp.fsdp()->take_gathers(), kSteps * kAccum * (1 + layers) * (reshard ? 2 : 1))
        << what << ": each unit once a forward and, resharded, once more a backward (the root: for lm_head)";
    EXPECT_LE(fsdp.fsdp()->max_gathered_layers(), reshard ? 1 : layers) << what;
    if (reshard) EXPECT_EQ(fsdp.fsdp()->max_gathered_layers(), 1) << what;
    expect_released(fsdp, what);
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, Fsdp, ::testing::Combine(::testing::ValuesIn(kLayouts), ::testing::Bool()),
                         [](const ::testing::TestParamInfo<std::tuple<Layout, bool>>& i) {
                           return std::string(std::get<0>(i.param).name) +
                                  (std::get<1>(i.param) ? "_full_shard" : "_shard_grad_op");
                         });

// Each rank keeps its chunk (1/dp_shard) of the f32 masters, the gradient and
// AdamW's two moments: 16 bytes per local parameter / dp_shard, and no whole slab.
TEST(FsdpMemory, EachRankKeepsOneChunkOfTheState) {
  if (dist::world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  for (const Layout& l : kLayouts) {
    PretrainedModel a = load("qwen3", replicated(l)), b = load("qwen3", l);
    Trainer ddp(a, args_for(std::string("memory-") + l.name), data());
    Trainer fsdp(b, args_for(std::string("memory-") + l.name, "full_shard"), data());
    ModelParameters& whole = ddp.parameters();
    ModelParameters& sharded = fsdp.parameters();
    const int64_t d = l.dp_shard, n = whole.numel();
    EXPECT_FALSE(sharded.master_slab().defined()) << l.name;
    EXPECT_FALSE(sharded.grad_slab().defined()) << l.name;
    // Chunks of every bucket: within one 16-element alignment step per bucket of n / d.
    const int64_t slack = 16 * static_cast<int64_t>(sharded.buckets().size());
    EXPECT_NEAR(static_cast<double>(sharded.state_numel()), static_cast<double>(n) / d, slack) << l.name;
    EXPECT_EQ(sharded.master_bytes(), 4 * std::max<int64_t>(sharded.state_numel(), 1)) << l.name;
    EXPECT_EQ(fsdp.optimizer().state_bytes(), 8 * sharded.state_numel()) << l.name;
    if (dist::world_rank() == 0)
      std::printf("%s: state elements per rank %lld (fsdp) against %lld (dp_replicate)\n", l.name,
                  static_cast<long long>(sharded.state_numel()), static_cast<long long>(n));
    for (size_t u = 0; u < sharded.units().size(); ++u) EXPECT_FALSE(sharded.unit_gathered(u));
  }
}

// Mixed precision, both ways bf16 runs here (native, and bf16 values in f32).
// One micro-batch of two blocks a step: with accumulation FSDP reduces each
// micro-batch's gradient (as FSDP2 does) where DDP reduces their sum, and bf16's
// rounding of the weights carries that last-bit difference to 2.5e-4 of the loss by step 8.
TEST(FsdpBf16, TrainsAsDpReplicate) {
  if (dist::world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const Layout l{"dpshard2_tp2", 1, 2, 2};
  for (const bool native : {false, true}) {
    const TrainerOptions how{.bf16_native_gemm = native};
    const std::string what = native ? "native bf16" : "bf16 in f32";
    TrainingArguments a = args_for("bf16-" + std::to_string(native));
    TrainingArguments f = args_for("bf16-" + std::to_string(native), "full_shard");
    for (TrainingArguments* x : {&a, &f}) {
      x->bf16 = true;
      x->gradient_accumulation_steps = 1;
      x->per_device_train_batch_size = 2;
    }
    PretrainedModel ma = load("qwen3", replicated(l)), mb = load("qwen3", l);
    Trainer ddp(ma, a, data(), nullptr, how);
    Trainer fsdp(mb, f, data(), nullptr, how);
    ASSERT_EQ(fsdp.parameters().bf16_native(), native);
    ddp.train();
    fsdp.train();
    expect_same_curve(fsdp, ddp, what, 1e-5);
    expect_same_weights(fsdp, ddp, what, 1e-5);
  }
}

// Checkpointing under FSDP: bitwise the run without it, with the same gathers
// (a recompute runs on the weights its backward gathered).
TEST(FsdpCheckpointing, BitwiseAndNoLayerGatheredTwice) {
  if (dist::world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const Layout l{"dpshard2_tp2", 1, 2, 2};
  for (const std::string policy : {"full", "selective"}) {
    PretrainedModel ma = load("qwen3", l), mb = load("qwen3", l);
    Trainer plain(ma, args_for("ckpt-plain-" + policy, "full_shard"), data());
    TrainingArguments c = args_for("ckpt-" + policy, "full_shard");
    c.gradient_checkpointing = true;
    c.gradient_checkpointing_kwargs = {{"policy", policy}};
    Trainer ckpt(mb, c, data());
    plain.train();
    ckpt.train();
    expect_same_curve(ckpt, plain, policy + " checkpointing", 0.0);
    expect_same_weights(ckpt, plain, policy + " checkpointing", 0.0);
    EXPECT_EQ(ckpt.fsdp()->take_gathers(), plain.fsdp()->take_gathers()) << policy;
  }
}

TEST(FsdpLora, AdaptersTrainAsDpReplicate) {
  if (dist::world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const Layout l{"dpshard2_tp2", 1, 2, 2};
  LoraConfig config;
  config.r = 4;
  config.lora_alpha = 8;
  config.target_modules = {"q_proj", "v_proj", "down_proj"};
  const auto init = tp::testing::nonzero_lora_init(3);
  PretrainedModel ma = load("llama", replicated(l)), mb = load("llama", l);
  LoraModel la = apply_lora(ma, config, init), lb = apply_lora(mb, config, init);
  Trainer ddp(ma, args_for("lora"), data(), nullptr, adapter_training(ma, la));
  Trainer fsdp(mb, args_for("lora", "full_shard"), data(), nullptr, adapter_training(mb, lb));
  ddp.train();
  fsdp.train();
  expect_same_curve(fsdp, ddp, "LoRA", 1e-5);
  expect_same_weights(fsdp, ddp, "LoRA", 1e-5);
  expect_released(fsdp, "LoRA");
}

// Checkpoints keep the layout-independent files: saved under FSDP, resumed on dp_replicate.
TEST(FsdpCheckpoint, ResumesOnDpReplicate) {
  if (dist::world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const Layout l{"dpshard2_tp2", 1, 2, 2};
  TrainingArguments a = args_for("resume", "full_shard");
  a.save_strategy = "steps";
  a.save_steps = 4;
  PretrainedModel ma = load("qwen3", l);
  Trainer first(ma, a, data());
  first.train();
  TrainingArguments b = args_for("resumed");
  PretrainedModel mb = load("qwen3", replicated(l));
  Trainer second(mb, b, data());
  second.train(a.output_dir + "/checkpoint-4");
  expect_same_curve(second, first, "resumed on dp_replicate", 1e-5, 5);
  expect_same_weights(second, first, "resumed on dp_replicate", 1e-5);
  // And the other way: a dp_replicate checkpoint into FSDP.
  TrainingArguments c = args_for("resumed-back", "full_shard");
  PretrainedModel mc = load("qwen3", l);
  Trainer third(mc, c, data());
  third.train(a.output_dir + "/checkpoint-4");
  expect_same_curve(third, first, "resumed on fsdp", 0.0, 5);
}

TEST(FsdpErrors, NameTheOptionAndTheSizes) {
  if (dist::world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  auto message = [](const Layout& l, TrainingArguments a) {
    try {
      PretrainedModel m = load("llama", l);
      Trainer t(m, a, data());
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message({"dp4", 4, 1, 1}, args_for("err", "full_shard")).find("dp_shard dim, which this run does not "
                                                                          "have (size 1)"),
            std::string::npos);
  EXPECT_NE(message({"dpshard4", 1, 4, 1}, args_for("err", "full_shard offload")).find("fsdp option 'offload'"),
            std::string::npos);
  TrainingArguments bad = args_for("err", "full_shard");
  bad.fsdp_config = {{"backward_prefetch", "BACKWARD_PRE"}};
  EXPECT_NE(message({"dpshard4", 1, 4, 1}, bad).find("fsdp_config: 'backward_prefetch' is not supported"),
            std::string::npos);
  TrainingArguments orphan = args_for("err");
  orphan.fsdp_config = {{"reshard_after_forward", false}};
  EXPECT_NE(message({"dpshard4", 1, 4, 1}, orphan).find("without fsdp"), std::string::npos);
  // Gemma 3's soft-capped logits: refused by name rather than failing inside the step.
  try {
    PretrainedModel m = load("gemma3", {"dpshard4", 1, 4, 1});
    Trainer t(m, args_for("err", "full_shard"), data());
    ADD_FAILURE() << "expected FSDP to refuse a soft-capped model";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("final_logit_softcapping 2"), std::string::npos) << e.what();
  }
}

// Evaluation under FSDP: ranks with one batch fewer (6 batches over 4 ranks) run
// an ignored forward, so every rank gathers every unit; the loss is dp_replicate's.
TEST(FsdpEval, UnevenBatchesGiveDpReplicatesLoss) {
  if (dist::world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  const Layout l{"dpshard4", 1, 4, 1};
  auto eval = tp::testing::synthetic_data(516, 6, kSeq);
  TrainingArguments a = args_for("eval"), f = args_for("eval", "full_shard");
  for (TrainingArguments* x : {&a, &f}) {
    x->per_device_eval_batch_size = 1;
    x->max_steps = 2;
  }
  PretrainedModel ma = load("qwen3", replicated(l)), mb = load("qwen3", l);
  Trainer ddp(ma, a, data(), eval);
  Trainer fsdp(mb, f, data(), eval);
  for (int round = 0; round < 2; ++round) {  // before and after training
    if (round == 1) {
      ddp.train();
      fsdp.train();
    }
    const double want = ddp.evaluate()["eval_loss"].get<double>();
    const double got = fsdp.evaluate()["eval_loss"].get<double>();
    expect_near_rel(got, want, 1e-5, "eval loss, round " + std::to_string(round));
    expect_released(fsdp, "after evaluate, round " + std::to_string(round));
  }
}
