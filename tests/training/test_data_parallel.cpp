// Data parallelism x tensor parallelism (4 ranks) equals one rank that trains on
// the whole global batch: dp_replicate 2 x tp 2, dp_shard 2 x tp 2, dp 4 and
// dp_replicate 2 x dp_shard 2 give the 20-step loss and gradient-norm curve and
// the final weights of the one-rank run (f32, 1e-4), with buckets small enough
// that there are many, replicas bitwise equal, the optimizer state halved by
// dp_shard = 2, buckets reduced while the backward runs, and a checkpoint saved
// under one dp layout resumed under another.
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstring>
#include <filesystem>

#include "models/model_test_util.h"
#include "training/training_test_util.h"
#include "tp/distributed/parallelism_config.h"
#include "tp/models/auto.h"
#include "tp/ops/gemm.h"
#include "tp/parallel/shards.h"
#include "tp/training/data_parallel.h"
#include "tp/training/lora_training.h"
#include "tp/training/trainer.h"

using namespace tp;
using namespace tp::training;
using tp::testing::expect_close_rel;
using tp::testing::expect_near_rel;
using tp::testing::model_dir;
using tp::testing::solo_mesh;

namespace {

namespace fs = std::filesystem;

constexpr int64_t kSeq = 16, kAccum = 2, kBlocks = 14;

struct Layout {
  const char* name;
  int64_t dp_replicate, dp_shard, tp;
};

std::ostream& operator<<(std::ostream& out, const Layout& l) { return out << l.name; }

const Layout kLayouts[] = {{"dp2_tp2", 2, 1, 2}, {"dpshard2_tp2", 1, 2, 2}, {"dp4", 4, 1, 1}, {"dp2_dpshard2", 2, 2, 1}};

std::shared_ptr<const dist::DeviceMesh> mesh_for(const Layout& l) {
  return dist::ParallelismConfig{l.dp_replicate, l.dp_shard, l.tp}.build_device_mesh();
}

PretrainedModel load(const std::string& name, std::shared_ptr<const dist::DeviceMesh> mesh) {
  LoadOptions o = LoadOptions::for_training();
  o.verbose = false;
  o.mesh = std::move(mesh);
  return AutoModelForCausalLM::from_pretrained(model_dir(name), o);
}

// Solo runs happen on every rank at once: one directory per rank; shared runs share one.
std::string out_dir(const std::string& test, bool solo) {
  fs::path p = fs::temp_directory_path() / ("tp-test-dp-" + std::to_string(::getppid())) /
               (test + (solo ? "-solo-rank" + std::to_string(dist::world_rank()) : ""));
  return p.string();
}

TrainingArguments args_for(const std::string& dir, int64_t per_device) {
  TrainingArguments a;
  a.output_dir = dir;
  a.learning_rate = 2e-3;
  a.weight_decay = 0.1;
  a.warmup_steps = 3;
  a.lr_scheduler_type = "cosine";
  a.max_grad_norm = 1.0;
  a.per_device_train_batch_size = per_device;
  a.gradient_accumulation_steps = kAccum;
  a.logging_steps = 1;
  a.save_strategy = "no";
  a.max_steps = 20;
  a.ddp_bucket_cap_mb = 0.02;  // ~5000 elements: the tiny model's gradients span many buckets
  return a;
}

std::shared_ptr<TokenBlocks> data() { return tp::testing::synthetic_data(516, kBlocks, kSeq); }

void expect_same_curve(const std::vector<nlohmann::json>& got, const std::vector<nlohmann::json>& want,
                       const std::string& what, int64_t from_step = 1, int64_t last_step = 20) {
  std::map<int64_t, const nlohmann::json*> by_step;
  for (const auto& e : want)
    if (e.contains("loss")) by_step[e["step"].get<int64_t>()] = &e;
  int compared = 0;
  for (const auto& e : got) {
    if (!e.contains("loss") || e["step"].get<int64_t>() < from_step) continue;
    const int64_t step = e["step"].get<int64_t>();
    ASSERT_TRUE(by_step.count(step)) << what << ": step " << step << " missing from the reference";
    expect_near_rel(e["loss"].get<double>(), (*by_step[step])["loss"].get<double>(), 1e-4,
                    what + " loss at step " + std::to_string(step));
    expect_near_rel(e["grad_norm"].get<double>(), (*by_step[step])["grad_norm"].get<double>(), 1e-4,
                    what + " grad norm at step " + std::to_string(step));
    ++compared;
  }
  EXPECT_EQ(compared, last_step - from_step + 1) << what;
}

class DataParallel : public ::testing::TestWithParam<Layout> {
 protected:
  void SetUp() override {
    if (dist::world_size() != 4) GTEST_SKIP() << "the layouts need 4 ranks";
  }
};

}  // namespace

TEST_P(DataParallel, TwentyStepsEqualOneRankWithTheWholeGlobalBatch) {
  const Layout l = GetParam();
  for (const std::string model : {"llama", "qwen3"}) {
    const std::string what = std::string(l.name) + " " + model;
    auto mesh = mesh_for(l);
    const int64_t dp = mesh->size("dp");
    // One micro-batch block per dp rank; the one-rank run takes them all at once.
    PretrainedModel solo = load(model, solo_mesh()), par = load(model, mesh);
    Trainer one(solo, args_for(out_dir(what, true), dp), data());
    Trainer many(par, args_for(out_dir(what, false), 1), data());
    ASSERT_EQ(many.dp_size(), dp);
    ASSERT_EQ(many.steps_per_epoch(), one.steps_per_epoch());
    ASSERT_GT(many.gradient_reducer()->bucket_count(), 4) << what;
    one.train();
    many.train();
    // 14 blocks in global micro-batches of dp: at dp 4 the last one of each epoch
    // holds 2 blocks, so two replicas have nothing and still take part.
    expect_same_curve(many.state().log_history, one.state().log_history, what);
    EXPECT_EQ(many.state().num_input_tokens_seen, one.state().num_input_tokens_seen) << what;
    expect_near_rel(many.state().total_flos, one.state().total_flos, 1e-12, what + " total_flos");

    ModelParameters& p = many.parameters();
    for (const TrainableParam& q : p.params())
      expect_close_rel(p.gather_master(q), one.parameters().find(q.name).master, 1e-4, what + " final " + q.name);
    // Every replica (and dp_shard rank, after the all-gather) holds the same bits.
    dist::ProcessGroup& dp_group = mesh->group("dp");
    Tensor all = dp_group.all_gather(p.master_slab(), 0);
    for (int r = 1; r < dp_group.size(); ++r)
      EXPECT_EQ(std::memcmp(all.narrow(0, r * p.numel(), p.numel()).raw_data(), all.narrow(0, 0, p.numel()).raw_data(),
                            p.master_slab().nbytes()),
                0)
          << what << ": dp rank " << r << " drifted from dp rank 0";
  }
}

INSTANTIATE_TEST_SUITE_P(Layouts, DataParallel, ::testing::ValuesIn(kLayouts),
                         [](const ::testing::TestParamInfo<Layout>& i) { return std::string(i.param.name); });

TEST(DataParallelMemory, DpShard2HalvesTheOptimizerState) {
  if (dist::world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  PretrainedModel a = load("llama", mesh_for({"dp2_tp2", 2, 1, 2}));
  PretrainedModel b = load("llama", mesh_for({"dpshard2_tp2", 1, 2, 2}));
  Trainer replicated(a, args_for(out_dir("memory-replicated", false), 1), data());
  Trainer sharded(b, args_for(out_dir("memory-sharded", false), 1), data());
  const int64_t r = replicated.optimizer().state_bytes(), s = sharded.optimizer().state_bytes();
  if (dist::world_rank() == 0)
    std::printf("optimizer state per rank: dp_replicate 2 x tp 2 %lld bytes, dp_shard 2 x tp 2 %lld bytes\n",
                static_cast<long long>(r), static_cast<long long>(s));
  EXPECT_EQ(r, 2 * static_cast<int64_t>(sizeof(float)) * replicated.parameters().numel());
  EXPECT_EQ(2 * s, r) << "dp_shard 2 keeps half of the AdamW state on each rank";
}

// Mixed precision: dp_shard keeps the f32 masters of its chunks alone (the
// matrices compute on their bf16 copies), and trains as the replicated layout does.
// Both ways bf16 runs here: native bf16 compute copies, and bf16 values in f32.
TEST(DataParallelMemory, DpShard2UnderBf16ShardsTheMasterWeights) {
  if (dist::world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  for (const bool native : {false, true}) {
    // The whole compute copy (sharded updates need it; the replicated run's is read between steps).
    const TrainerOptions how{.bf16_native_gemm = native, .compute_copy_by_layer = false};
    const std::string tag = native ? "native bf16" : "bf16 in f32";
    TrainingArguments a = args_for(out_dir("bf16-replicated", false), 1);
    a.bf16 = true;
    a.max_steps = 8;
    PretrainedModel ma = load("qwen3", mesh_for({"dp2_tp2", 2, 1, 2}));
    PretrainedModel mb = load("qwen3", mesh_for({"dpshard2_tp2", 1, 2, 2}));
    Trainer replicated(ma, a, data(), nullptr, how);
    a.output_dir = out_dir("bf16-sharded", false);
    Trainer sharded(mb, a, data(), nullptr, how);
    ModelParameters& r = replicated.parameters();
    ModelParameters& s = sharded.parameters();
    ASSERT_EQ(s.bf16_native(), native);
    EXPECT_FALSE(r.masters_sharded());
    ASSERT_TRUE(s.masters_sharded());
    for (const TrainableParam& q : s.params())
      EXPECT_EQ(q.master.defined(), q.global_shape.size() < 2) << q.name << ": only vectors keep whole masters";
    if (dist::world_rank() == 0)
      std::printf("%s master weights per rank: dp_replicate 2 x tp 2 %lld bytes, dp_shard 2 x tp 2 %lld bytes\n",
                  tag.c_str(), static_cast<long long>(r.master_bytes()), static_cast<long long>(s.master_bytes()));
    EXPECT_LT(s.master_bytes(), r.master_bytes() * 6 / 10) << "about half (the vectors stay whole)";
    replicated.train();
    sharded.train();
    expect_same_curve(sharded.state().log_history, replicated.state().log_history, tag + " dp_shard vs replicated", 1,
                      8);
    for (const TrainableParam& q : s.params()) {
      expect_close_rel(s.gather_master(q), r.gather_master(r.find(q.name)), 1e-5, tag + " final master " + q.name);
      expect_close_rel(q.compute.to(DType::F32), r.find(q.name).compute.to(DType::F32), 1e-5,
                       tag + " compute " + q.name);
    }
  }
}

// LoRA with dropout on dp 2 x tp 2: the adapter's masks follow each token's row
// in the global batch, so the run equals one rank with the whole batch.
TEST(DataParallelLora, DropoutAdaptersTrainAsOneRankWithTheWholeBatch) {
  if (dist::world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  LoraConfig config;
  config.r = 4;
  config.lora_alpha = 8;
  config.lora_dropout = 0.2;
  config.target_modules = {"q_proj", "v_proj", "down_proj"};
  const auto init = tp::testing::nonzero_lora_init(3);
  PretrainedModel solo = load("llama", solo_mesh()), par = load("llama", mesh_for({"dp2_tp2", 2, 1, 2}));
  LoraModel solo_lora = apply_lora(solo, config, init), par_lora = apply_lora(par, config, init);
  Trainer one(solo, args_for(out_dir("lora", true), 2), data(), nullptr, adapter_training(solo, solo_lora));
  Trainer many(par, args_for(out_dir("lora", false), 1), data(), nullptr, adapter_training(par, par_lora));
  one.train();
  many.train();
  expect_same_curve(many.state().log_history, one.state().log_history, "LoRA dropout 0.2 on dp 2 x tp 2");
  for (const TrainableParam& q : many.parameters().params())
    expect_close_rel(many.parameters().gather_master(q), one.parameters().find(q.name).master, 1e-4,
                     "LoRA final " + q.name);
}

TEST(DataParallelOverlap, BucketsAreReducedWhileTheBackwardRuns) {
  if (dist::world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  for (const Layout& l : kLayouts) {
    PretrainedModel m = load("llama", mesh_for(l));
    TrainingArguments a = args_for(out_dir(std::string("overlap-") + l.name, false), 1);
    a.max_steps = 1;  // a step where every replica has data (at dp 4 each epoch's second is short)
    Trainer t(m, a, data());
    t.train();
    const GradientReducer& g = *t.gradient_reducer();
    // All but the first bucket (the replicated norms, or the embedding the
    // backward reaches last) are complete before the backward ends.
    EXPECT_GE(g.launched_during_backward(), g.bucket_count() - 2) << l.name << ": " << g.bucket_count() << " buckets";
  }
}

// Saved by dp_shard 2 x tp 2 (optimizer state, and under bf16 the masters,
// gathered over dp_shard), resumed by dp_replicate 2 x tp 2, in f32 and bf16.
TEST(DataParallelCheckpoint, ResumesOnAnotherDpLayout) {
  if (dist::world_size() != 4) GTEST_SKIP() << "needs 4 ranks";
  for (const bool bf16 : {false, true}) {
    const std::string tag = bf16 ? "bf16" : "f32";
    const std::string dir = out_dir("reshard-" + tag, false);
    TrainingArguments a = args_for(dir, 1);
    a.bf16 = bf16;
    a.save_strategy = "steps";
    a.save_steps = 10;
    PretrainedModel sharded = load("qwen3", mesh_for({"dpshard2_tp2", 1, 2, 2}));
    Trainer first(sharded, a, data());
    first.train();
    a.output_dir = out_dir("reshard-resumed-" + tag, false);
    PretrainedModel replicated = load("qwen3", mesh_for({"dp2_tp2", 2, 1, 2}));
    Trainer second(replicated, a, data());
    second.train(dir + "/checkpoint-10");
    expect_same_curve(second.state().log_history, first.state().log_history, tag + " resumed on dp_replicate", 11);
    for (const TrainableParam& q : second.parameters().params())
      expect_close_rel(second.parameters().gather_master(q),
                       first.parameters().gather_master(first.parameters().find(q.name)), 1e-4,
                       tag + " resumed final " + q.name);
    if (bf16) continue;
    // Another global batch is another run: refused, naming it.
    a.output_dir = out_dir("reshard-other-batch", false);
    a.per_device_train_batch_size = 2;
    PretrainedModel other = load("qwen3", mesh_for({"dp2_tp2", 2, 1, 2}));
    Trainer third(other, a, data());
    try {
      third.train(dir + "/checkpoint-10");
      ADD_FAILURE() << "resuming with another global batch must fail";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("total_train_batch_size: 4 in the checkpoint, 8 now"), std::string::npos)
          << e.what();
    }
  }
}
