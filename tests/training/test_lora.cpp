// LoRA adapters on a tensor-parallel model (tp = world size; CTest runs 1, 2 and
// 4 ranks) against the same model whole on every rank (a one-rank mesh), and
// against the PyTorch oracle (tests/reference/reference_lora.py): losses,
// adapter gradients and adapter weights; the base stays frozen; saved adapters
// load at another tp size; merging gives the adapted model's logits.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "distributed/dist_test_util.h"
#include "models/model_test_util.h"
#include "training/training_test_util.h"
#include "tp/io/safetensors.h"
#include "tp/models/auto.h"
#include "tp/models/save_pretrained.h"
#include "tp/parallel/shards.h"
#include "tp/training/adapter_files.h"
#include "tp/training/lora_training.h"
#include "tp/tensor/random.h"

using namespace tp;
using namespace tp::training;
using tp::testing::model_dir;
using tp::testing::expect_close_rel;
using tp::testing::expect_near_rel;
using tp::testing::solo_mesh;

namespace {

namespace fs = std::filesystem;

constexpr int64_t kBatch = 2, kSeq = 16, kAccum = 2;
const std::vector<std::string> kAllProjections = {"q_proj", "k_proj", "v_proj", "o_proj",
                                                  "gate_proj", "up_proj", "down_proj"};
// Phi-3's are fused: q|k|v and gate|up.
const std::vector<std::string> kPhi3Projections = {"qkv_proj", "o_proj", "gate_up_proj", "down_proj"};
const std::vector<std::string>& projections(const std::string& model) {
  return model.starts_with("phi3") ? kPhi3Projections : kAllProjections;
}
// Phi-3 runs the tests its fused, gathered projections change (the oracle, tp N against
// one rank, merging); the LoRA machinery no architecture changes (embedding adapters,
// dropout, frozen base) runs on llama and qwen3, which keeps the suite's time at 4 ranks.
#define SKIP_FOR_PHI3(model) \
  if ((model).starts_with("phi3")) GTEST_SKIP() << "architecture-independent; run on llama and qwen3"

std::unique_ptr<PretrainedModel> load(const std::string& name, bool whole, bool training = true,
                                      const std::string& tp_plan = "auto") {
  LoadOptions o = training ? LoadOptions::for_training() : LoadOptions{};
  o.verbose = false;
  o.distributed_config.tp_plan = tp_plan;
  if (whole) o.mesh = solo_mesh();
  return std::make_unique<PretrainedModel>(AutoModelForCausalLM::from_pretrained(model_dir(name), o));
}

fs::path scratch(const std::string& test, bool per_rank) {
  return fs::temp_directory_path() / ("tp-test-lora-" + std::to_string(::getppid())) /
         (per_rank ? test + "-rank" + std::to_string(dist::world_rank()) : test);
}

training::LoraConfig all_projections(const std::string& model, int64_t r, double alpha, double dropout = 0) {
  training::LoraConfig c;
  c.r = r;
  c.lora_alpha = alpha;
  c.lora_dropout = dropout;
  c.target_modules = projections(model);
  return c;
}

// PEFT's init for A and a small random B, so that the first step's A gradients are not zero.
Tensor nonzero_init(const nn::Parameter& p) {
  if (p.name.find("lora_B") != std::string::npos || p.name.find("lora_embedding") != std::string::npos) {
    uint64_t h = 7;
    for (unsigned char ch : p.name) h = mix64(h ^ ch);
    return Tensor::randn(p.global_shape, h, 0.f, 0.05f);
  }
  return training::peft_init(3)(p);
}

std::shared_ptr<TokenBlocks> synthetic_data(int64_t vocab, int64_t blocks) {
  return tp::testing::synthetic_data(vocab, blocks, kSeq);
}

TrainingArguments args_for(const fs::path& dir) {
  TrainingArguments a;
  a.output_dir = dir.string();
  a.learning_rate = 1e-2;
  a.weight_decay = 0.1;
  a.warmup_steps = 3;
  a.lr_scheduler_type = "cosine";
  a.max_grad_norm = 0.5;
  a.per_device_train_batch_size = kBatch;
  a.gradient_accumulation_steps = kAccum;
  a.logging_steps = 1;
  a.save_strategy = "no";
  return a;
}

// A model with adapters and its Trainer.
struct Adapted {
  std::unique_ptr<PretrainedModel> model;
  training::LoraModel lora;
  std::unique_ptr<Trainer> trainer;
};

Adapted adapted(const std::string& name, bool whole, const training::LoraConfig& config,
                const std::function<Tensor(const nn::Parameter&)>& init, TrainingArguments args,
                std::shared_ptr<TokenBlocks> data, const std::string& test, const std::string& tp_plan = "auto") {
  Adapted a{load(name, whole, true, tp_plan), {}, nullptr};
  a.lora = training::apply_lora(*a.model, config, init);
  args.output_dir = scratch(test + (whole ? "-solo" : "-tp"), whole).string();
  a.trainer = std::make_unique<Trainer>(*a.model, args, data, nullptr, training::adapter_training(*a.model, a.lora));
  return a;
}

double meta(const io::SafetensorsFile& f, const std::string& key) { return std::stod(f.metadata().at(key)); }

fs::path golden_dir() {
  const char* dir = std::getenv("TP_GOLDEN_DIR");
  if (dir == nullptr) throw Error("TP_GOLDEN_DIR is not set (CTest sets it to tests/reference/golden)");
  return dir;
}

class Lora : public ::testing::TestWithParam<std::string> {};

}  // namespace

// The PyTorch oracle's 20 steps, at every tp size: the initial adapter is the
// oracle's PEFT directory (so loading PEFT files is part of the test).
TEST_P(Lora, TwentyStepsMatchPyTorch) {
  const std::string model = GetParam();
  auto golden = io::SafetensorsFile::open(golden_dir() / ("lora_" + model + ".safetensors"));
  const int64_t steps = static_cast<int64_t>(meta(*golden, "steps")), accum = static_cast<int64_t>(meta(*golden, "accum"));
  std::unique_ptr<PretrainedModel> m = load(model + "-train", false);
  training::LoraModel lora = training::load_adapter(*m, golden_dir() / ("lora_" + model + "_init"));
  EXPECT_DOUBLE_EQ(lora.config().scaling(), meta(*golden, "lora_scaling"));

  Tensor ids = golden->read("input_ids"), labels = golden->read("labels");
  const int64_t B = ids.size(2), T = ids.size(3);
  std::vector<int32_t> stream;
  for (int64_t v : ids.to_int_vector()) stream.push_back(static_cast<int32_t>(v));
  TrainingArguments a = args_for(scratch("oracle-" + model, true));
  a.learning_rate = meta(*golden, "base_lr");
  a.warmup_steps = meta(*golden, "warmup_steps");
  a.max_steps = steps;
  a.max_grad_norm = meta(*golden, "max_grad_norm");
  a.weight_decay = meta(*golden, "weight_decay");
  a.per_device_train_batch_size = B;
  a.gradient_accumulation_steps = accum;
  Trainer trainer(*m, a, std::make_shared<TokenBlocks>(TokenBlocks::from_tokens(stream, T)), nullptr,
                  training::adapter_training(*m, lora));
  ModelParameters& params = trainer.parameters();
  std::vector<float> loss = golden->read("loss").to_vector(), norm = golden->read("grad_norm").to_vector();
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<MicroBatch> mbs;
    for (int64_t k = 0; k < accum; ++k)
      mbs.push_back({ids.select(0, s).select(0, k).clone(), labels.select(0, s).select(0, k).clone()});
    StepResult r = trainer.training_step(mbs);
    expect_near_rel(r.loss, loss[s], 1e-5, model + " loss at step " + std::to_string(s));
    expect_near_rel(r.grad_norm, norm[s], 1e-5, model + " grad norm at step " + std::to_string(s));
    if (s == 0)
      for (const TrainableParam& p : params.params())
        expect_close_rel(parallel::gather_full(p.grad, p.global_shape, p.shards, params.group()),
                         golden->read("grad0." + training::LoraModel::peft_key(p.name)), 1e-5,
                         model + " step-0 gradient of " + p.name);
  }
  ASSERT_EQ(params.params().size(), 2 * projections(model).size() * 2u) << "only the adapters train";
  for (const TrainableParam& p : params.params())
    expect_close_rel(params.gather_master(p), golden->read("final." + training::LoraModel::peft_key(p.name)), 1e-5,
                     model + " final " + p.name);
}

// tp = N against tp = 1 on the tiny models (r 8 on every projection), dropout
// on: the masks are the same whatever the split.
TEST_P(Lora, CurveAndGradientsEqualOneRankWithDropout) {
  const std::string model = GetParam();
  auto data = synthetic_data(516, 12);
  TrainingArguments args = args_for("");
  args.max_steps = 20;
  const training::LoraConfig config = all_projections(model, 8, 16, 0.1);
  Adapted solo = adapted(model, true, config, nonzero_init, args, data, "curve-" + model);
  Adapted par = adapted(model, false, config, nonzero_init, args, data, "curve-" + model);

  // One step by hand: the adapter gradients.
  training::LoraModel* loras[] = {&solo.lora, &par.lora};
  for (training::LoraModel* l : loras) l->begin_step(0);
  TokenBlocks blocks = *data;
  std::vector<MicroBatch> mbs;
  for (int64_t k = 0; k < kAccum; ++k) {
    Tensor ids = blocks.batch({2 * k, 2 * k + 1});
    mbs.push_back({ids, ids.clone()});
  }
  StepResult a = solo.trainer->training_step(mbs), b = par.trainer->training_step(mbs);
  expect_near_rel(b.loss, a.loss, 1e-5, model + " step loss");
  ModelParameters& sp = solo.trainer->parameters();
  ModelParameters& pp = par.trainer->parameters();
  ASSERT_EQ(sp.params().size(), pp.params().size());
  for (const TrainableParam& q : pp.params())
    expect_close_rel(parallel::gather_full(q.grad, q.global_shape, q.shards, pp.group()), sp.find(q.name).grad, 1e-5,
                     model + " gradient of " + q.name);

  // The 20-step curve through train() (fresh trainers: the hand step moved the weights).
  Adapted solo2 = adapted(model, true, config, nonzero_init, args, data, "curve2-" + model);
  Adapted par2 = adapted(model, false, config, nonzero_init, args, data, "curve2-" + model);
  solo2.trainer->train();
  par2.trainer->train();
  const auto& h1 = solo2.trainer->state().log_history;
  const auto& hn = par2.trainer->state().log_history;
  ASSERT_EQ(h1.size(), hn.size());
  int steps = 0;
  for (size_t i = 0; i < h1.size(); ++i) {
    if (!h1[i].contains("loss")) continue;
    ++steps;
    expect_near_rel(hn[i]["loss"].get<double>(), h1[i]["loss"].get<double>(), 1e-4,
                    model + " loss at step " + std::to_string(h1[i]["step"].get<int64_t>()));
  }
  EXPECT_EQ(steps, 20);
  EXPECT_LT(h1.back()["train_loss"].get<double>(), h1.front()["loss"].get<double>()) << "the loss falls";
}

// Embedding adapters under each way the table can be split (replicated, by
// vocabulary rows, by columns), with a projection adapter next to them: one step's
// gradients and a 6-step curve equal one rank's; merged, the same logits.
TEST_P(Lora, EmbeddingAdaptersUnderEveryEmbeddingStyle) {
  const std::string model = GetParam();
  SKIP_FOR_PHI3(model);
  auto data = synthetic_data(516, 12);
  TrainingArguments args = args_for("");
  args.max_steps = 6;
  training::LoraConfig config = all_projections(model, 4, 8);
  config.target_modules = {"embed_tokens", projections(model).front(), "down_proj"};
  for (const std::string style : {"", "embedding_rowwise", "embedding_colwise"}) {
    const std::string plan = style.empty() ? "auto" : "{\"model.embed_tokens\": \"" + style + "\"}";
    const std::string what = model + " embed_tokens " + (style.empty() ? "replicated" : style);
    Adapted solo = adapted(model, true, config, nonzero_init, args, data, "emb-" + model + style);
    Adapted par = adapted(model, false, config, nonzero_init, args, data, "emb-" + model + style, plan);
    ASSERT_EQ(par.lora.adapted().size(), 1 + 2 * 2u);
    solo.trainer->train();
    par.trainer->train();
    const auto& h1 = solo.trainer->state().log_history;
    const auto& hn = par.trainer->state().log_history;
    ASSERT_EQ(h1.size(), hn.size());
    for (size_t i = 0; i < h1.size(); ++i)
      if (h1[i].contains("loss"))
        expect_near_rel(hn[i]["loss"].get<double>(), h1[i]["loss"].get<double>(), 1e-4, what + " loss");
    ModelParameters& sp = solo.trainer->parameters();
    ModelParameters& pp = par.trainer->parameters();
    for (const TrainableParam& q : pp.params()) {
      expect_close_rel(pp.gather_master(q), sp.find(q.name).master, 1e-4, what + " trained " + q.name);
      expect_close_rel(parallel::gather_full(q.grad, q.global_shape, q.shards, pp.group()), sp.find(q.name).grad,
                       1e-4, what + " last gradient of " + q.name);
    }
    const training::AdaptedModule& emb = par.lora.adapted().front();
    EXPECT_EQ(emb.A->name, "model.embed_tokens.lora_embedding_A");
    // A is split when the table is split by vocabulary rows (embedding_rowwise, or
    // qwen3's table tied to its column-parallel lm_head); B when split by columns.
    const nn::ParamShard& ws = emb.base_weight->shard;
    if (dist::world_size() > 1) {
      EXPECT_EQ(emb.A->shard.replicated(), ws.replicated() || ws.dim != 0) << what;
      EXPECT_EQ(emb.B->shard.replicated(), ws.replicated() || ws.dim != 1) << what;
      if (style == "embedding_rowwise") {
        EXPECT_FALSE(emb.A->shard.replicated()) << what;
      }
      if (style == "embedding_colwise") {
        EXPECT_FALSE(emb.B->shard.replicated()) << what;
      }
    }
    Tensor ids = Tensor::from_ints({5, 17, 300, 2, 515}, {5});
    const Tensor want = par.model->forward(ids);
    par.lora.merge_into_base();
    expect_close_rel(par.model->forward(ids), want, 1e-5, what + " merged logits");
  }
}

TEST_P(Lora, DropoutIsOnInTrainingAndOffInEvaluation) {
  const std::string model = GetParam();
  SKIP_FOR_PHI3(model);
  auto data = synthetic_data(516, 4);
  TrainingArguments args = args_for("");
  Adapted with =
      adapted(model, false, all_projections(model, 8, 16, 0.5), nonzero_init, args, data, "dropout-on-" + model);
  Adapted without =
      adapted(model, false, all_projections(model, 8, 16, 0.0), nonzero_init, args, data, "dropout-off-" + model);
  Tensor ids = data->batch({0, 1});
  // With gradients on (the adapters require them once a Trainer holds them), dropout draws masks.
  auto training_logits = [&](Adapted& a, int64_t step) {
    a.lora.begin_step(step);
    return a.model->lm().forward_ids(ids).logits;
  };
  const Tensor l0 = training_logits(with, 0), l1 = training_logits(with, 1), again = training_logits(with, 0);
  EXPECT_FALSE(equal(l0, training_logits(without, 0))) << "dropout changes the training forward";
  EXPECT_FALSE(equal(l0, l1)) << "another step draws another mask";
  EXPECT_TRUE(equal(l0, again)) << "the same step draws the same mask";
  EXPECT_TRUE(equal(with.model->forward(ids), without.model->forward(ids))) << "no dropout without gradients";
}

TEST_P(Lora, BaseStaysFrozenAndOnlyAdaptersHoldOptimizerState) {
  const std::string model = GetParam();
  SKIP_FOR_PHI3(model);
  auto data = synthetic_data(516, 8);
  TrainingArguments args = args_for("");
  args.max_steps = 3;
  Adapted a = adapted(model, false, all_projections(model, 4, 8), nonzero_init, args, data, "frozen-" + model);
  std::map<std::string, Tensor> before;
  for (nn::Parameter* p : a.model->lm().parameters())
    if (!training::LoraModel::is_adapter_parameter(p->name)) before[p->name] = p->data.clone();
  a.trainer->train();
  for (nn::Parameter* p : a.model->lm().parameters())
    if (before.count(p->name)) {
      EXPECT_TRUE(equal(p->data, before[p->name])) << p->name << " moved";
    }
  int64_t adapter_local = 0;
  for (const training::AdaptedModule& l : a.lora.adapted()) adapter_local += l.A->data.numel() + l.B->data.numel();
  const ModelParameters& params = a.trainer->parameters();
  EXPECT_EQ(params.params().size(), a.lora.adapted().size() * 2);
  EXPECT_LE(params.numel(), adapter_local + 16 * static_cast<int64_t>(params.params().size())) << "slabs: adapters only";
}

// Saved at this tp size (gathered), loaded whole: the same logits; merged into
// the base: the same logits, also after save_pretrained and a plain reload.
TEST_P(Lora, SavedAdapterLoadsWholeAndMergesToTheSameLogits) {
  const std::string model = GetParam();
  auto data = synthetic_data(516, 8);
  TrainingArguments args = args_for("");
  args.max_steps = 3;
  Adapted a = adapted(model, false, all_projections(model, 8, 16), nonzero_init, args, data, "save-" + model);
  a.trainer->train();
  const fs::path dir = scratch("saved-" + model, false);
  a.trainer->save_model(dir);
  Tensor ids = Tensor::from_ints({5, 17, 300, 2, 44, 101, 9}, {7});
  const Tensor want = a.model->forward(ids);

  std::unique_ptr<PretrainedModel> whole = load(model, true, false);  // inference load: packed base
  training::LoraModel lora = training::load_adapter(*whole, dir);
  EXPECT_EQ(lora.config().r, 8);
  expect_close_rel(whole->forward(ids), want, 1e-5, model + " logits of the reloaded adapter");

  std::unique_ptr<PretrainedModel> merged = load(model, false);
  training::LoraModel m = training::load_adapter(*merged, dir);
  m.merge_into_base();
  expect_close_rel(merged->forward(ids), want, 1e-5, model + " logits after merging");
  const fs::path out = scratch("merged-" + model, false);
  save_pretrained(*merged, out);
  std::unique_ptr<PretrainedModel> plain = std::make_unique<PretrainedModel>(AutoModelForCausalLM::from_pretrained(out));
  expect_close_rel(plain->forward(ids), want, 1e-5, model + " logits of the merged checkpoint");
}

TEST(LoraErrors, NamesWhatDoesNotFit) {
  std::unique_ptr<PretrainedModel> m = load("llama", false);
  training::LoraConfig c = all_projections("llama", 4, 8);
  c.target_modules = {"q_proj", "qkv_proj"};
  try {
    training::apply_lora(*m, c, training::peft_init(1));
    ADD_FAILURE() << "applied";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("target module 'qkv_proj' matches no Linear or Embedding module of this llama "
                                         "model; they are named down_proj, embed_tokens, gate_proj, k_proj, lm_head"),
              std::string::npos)
        << e.what();
  }
  // The oracle's adapter is for llama-train (hidden 32): on tiny llama (hidden 192) its shapes do not fit.
  std::unique_ptr<PretrainedModel> other = load("llama", false);
  try {
    training::load_adapter(*other, golden_dir() / "lora_llama_init");
    ADD_FAILURE() << "loaded";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight' has shape "
                                         "[4, 32] but this model needs [4, 192]"),
              std::string::npos)
        << e.what();
  }
}

TEST(LoraConfig, RegexTargetsAndPeftFiles) {
  std::unique_ptr<PretrainedModel> m = load("llama", false);
  training::LoraConfig c;
  c.target_regex = R"(.*\.layers\.1\.self_attn\.(q|v)_proj)";
  training::LoraModel lora = training::apply_lora(*m, c, training::peft_init(1));
  ASSERT_EQ(lora.adapted().size(), 2u);
  EXPECT_EQ(lora.adapted()[0].base->name(), "model.layers.1.self_attn.q_proj");
  c.target_regex = "(";
  EXPECT_THROW(training::apply_lora(*m, c, training::peft_init(1)), Error);
  auto error_of = [](const nlohmann::json& j) {
    try {
      training::LoraConfig::from_json(j, "a/adapter_config.json");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  EXPECT_NE(error_of({{"peft_type", "PREFIX_TUNING"}}).find("'peft_type' is 'PREFIX_TUNING'"), std::string::npos);
  EXPECT_NE(error_of({{"peft_type", "LORA"}, {"r", "eight"}}).find("a/adapter_config.json: [json.exception"),
            std::string::npos);
  EXPECT_NE(error_of({{"peft_type", "LORA"}, {"use_dora", true}}).find("DoRA"), std::string::npos);
  EXPECT_EQ(error_of({{"peft_type", "LORA"}, {"fan_in_fan_out", nullptr}, {"modules_to_save", nullptr}}), "")
      << "PEFT writes nulls for unset keys";
}

INSTANTIATE_TEST_SUITE_P(Models, Lora, ::testing::Values("llama", "qwen3", "qwen2", "phi3", "gemma3"));
