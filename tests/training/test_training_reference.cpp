// tp = 1 training against the independent PyTorch oracle
// (tests/reference/reference_training.py, whose goldens CTest regenerates and
// checks first): the same checkpoint, token ids, labels, AdamW with Transformers'
// decay groups, warmup + cosine, clipping and gradient accumulation give the
// same per-step losses, gradient norms and learning rates, and the same weights
// after 20 steps, within 1e-5 relative.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>

#include "models/model_test_util.h"
#include "tp/io/safetensors.h"
#include "tp/models/auto.h"
#include "tp/training/trainer.h"

using namespace tp;
using namespace tp::training;

namespace {

namespace fs = std::filesystem;

fs::path golden_path(const std::string& model) {
  const char* dir = std::getenv("TP_GOLDEN_DIR");
  if (dir == nullptr) throw Error("TP_GOLDEN_DIR is not set (CTest sets it to tests/reference/golden)");
  return fs::path(dir) / ("train_" + model + ".safetensors");
}

double meta(const io::SafetensorsFile& f, const std::string& key) {
  auto it = f.metadata().find(key);
  if (it == f.metadata().end()) throw Error(f.path().string() + ": no metadata '" + key + "'");
  return std::stod(it->second);
}

void expect_rel(double got, double want, double tol, const std::string& what) {
  EXPECT_LE(std::abs(got - want), tol * std::abs(want)) << what << ": tp " << got << ", PyTorch " << want;
}

class Reference : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(Reference, TwentyStepsMatchPyTorch) {
  const std::string model = GetParam();
  auto golden = io::SafetensorsFile::open(golden_path(model));
  const int64_t steps = static_cast<int64_t>(meta(*golden, "steps")), accum = static_cast<int64_t>(meta(*golden, "accum"));
  EXPECT_EQ(golden->metadata().at("lr_scheduler"), "cosine");
  EXPECT_EQ(meta(*golden, "ignore_index"), -100);

  LoadOptions o = LoadOptions::for_training();
  o.verbose = false;
  PretrainedModel m = AutoModelForCausalLM::from_pretrained(tp::testing::model_dir(model + "-train"), o);

  Tensor ids = golden->read("input_ids"), labels = golden->read("labels");
  ASSERT_EQ(ids.dim(), 4);
  const int64_t B = ids.size(2), T = ids.size(3);
  std::vector<int32_t> stream;
  for (int64_t v : ids.to_int_vector()) stream.push_back(static_cast<int32_t>(v));

  TrainingArguments a;
  a.output_dir = (fs::temp_directory_path() / ("tp-test-reference-" + model)).string();
  a.learning_rate = meta(*golden, "base_lr");
  a.warmup_steps = meta(*golden, "warmup_steps");
  a.lr_scheduler_type = "cosine";
  a.max_steps = steps;
  a.max_grad_norm = meta(*golden, "max_grad_norm");
  a.weight_decay = meta(*golden, "weight_decay");
  a.adam_beta1 = meta(*golden, "beta1");
  a.adam_beta2 = meta(*golden, "beta2");
  a.adam_epsilon = meta(*golden, "eps");
  a.per_device_train_batch_size = B;
  a.gradient_accumulation_steps = accum;
  a.save_strategy = "no";
  Trainer trainer(m, a, std::make_shared<TokenBlocks>(TokenBlocks::from_tokens(stream, T)));

  std::vector<float> loss = golden->read("loss").to_vector(), norm = golden->read("grad_norm").to_vector(),
                     lr = golden->read("lr").to_vector();
  // MoE: the routers' load-balancing loss (output_router_logits in the model's config).
  std::vector<float> aux;
  if (golden->find("aux_loss") != nullptr) aux = golden->read("aux_loss").to_vector();
  for (int64_t s = 0; s < steps; ++s) {
    std::vector<MicroBatch> mbs;
    for (int64_t k = 0; k < accum; ++k)
      mbs.push_back({ids.select(0, s).select(0, k).clone(), labels.select(0, s).select(0, k).clone()});
    StepResult r = trainer.training_step(mbs);
    const std::string at = model + " step " + std::to_string(s);
    expect_rel(r.loss, loss[s], 1e-5, at + " loss");
    expect_rel(r.grad_norm, norm[s], 1e-5, at + " grad norm");
    if (!aux.empty()) expect_rel(r.aux_loss, aux[s], 1e-5, at + " aux loss");
    if (lr[s] == 0) EXPECT_EQ(r.learning_rate, 0) << at;
    else expect_rel(r.learning_rate, lr[s], 1e-6, at + " learning rate");
  }
  int compared = 0;
  for (const io::TensorInfo& t : golden->tensors()) {
    if (t.name.rfind("final.", 0) != 0) continue;
    const std::string name = t.name.substr(6);
    Tensor want = golden->read(t.name);
    const Tensor& got = trainer.parameters().find(name).master;
    EXPECT_LE(max_abs_diff(got, want), 1e-5 * max_abs(want)) << model << " final " << name;
    ++compared;
  }
  EXPECT_EQ(compared, static_cast<int>(trainer.parameters().params().size()));
}

INSTANTIATE_TEST_SUITE_P(Models, Reference, ::testing::Values("llama", "mistral", "qwen3", "qwen3_moe", "qwen2", "phi3", "gemma3"));
