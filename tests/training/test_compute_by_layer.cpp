// Under bf16 without FSDP the Trainer holds the matrices' bf16 compute weights a
// decoder layer (or the root: embeddings, lm_head) at a time, rounded from the
// f32 masters where the layer runs, forward and backward (FSDP's units with
// d = 1; TrainerOptions::compute_copy_by_layer), instead of a whole bf16 copy.
// At tp = world size (CTest runs 1 and 2 ranks), against the same model trained
// with the whole copy: bitwise the losses, gradient norms, gradients and updated
// weights over steps of two micro-batches, with native bf16 GEMMs and with bf16
// values in f32, tied and untied lm_head, with checkpointing and with LoRA, and
// the evaluation loss. A layer that ran on weights rounded before the last update
// (a stale copy) or not rounded at all changes bits. And the copy is never
// whole: at most one layer's weights are held at a time, the most bytes held at
// once are the largest unit's, and between steps none is held.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "models/model_test_util.h"
#include "training/training_test_util.h"
#include "tp/models/auto.h"
#include "tp/training/fsdp.h"
#include "tp/training/lora_training.h"
#include "tp/training/trainer.h"

using namespace tp;
using namespace tp::training;
using tp::testing::model_dir;

namespace {

struct Case {
  std::string name, model;
  bool native = true;              // TrainerOptions::bf16_native_gemm
  nlohmann::json checkpointing;    // gradient_checkpointing_kwargs; null: off
  bool lora = false;
};

std::string case_name(const ::testing::TestParamInfo<Case>& info) { return info.param.name; }
void PrintTo(const Case& c, std::ostream* out) { *out << c.name; }

struct TrainingRun {
  PretrainedModel model;
  std::optional<LoraModel> lora;
  std::unique_ptr<Trainer> trainer;
};

TrainingRun start(const Case& c, bool by_layer, std::shared_ptr<const TokenBlocks> data) {
  LoadOptions o = LoadOptions::for_training();
  o.verbose = false;
  TrainingRun r{AutoModelForCausalLM::from_pretrained(model_dir(c.model), o)};
  TrainerOptions options;
  if (c.lora) {
    LoraConfig config;
    config.r = 4;
    config.lora_alpha = 8;
    config.target_modules = {"q_proj", "v_proj", "down_proj"};
    r.lora = apply_lora(r.model, config, tp::testing::nonzero_lora_init(7));
    options = adapter_training(r.model, *r.lora);
  }
  options.bf16_native_gemm = c.native;
  options.compute_copy_by_layer = by_layer;
  TrainingArguments a;
  a.bf16 = true;
  a.learning_rate = 5e-3;  // large enough that one update moves many weights by a bf16 step
  a.per_device_train_batch_size = 2;
  a.warmup_steps = a.max_grad_norm = 1.0;
  a.save_strategy = "no";
  const std::string dir = "tp-test-by-layer-" + std::to_string(::getppid());
  a.output_dir = (std::filesystem::temp_directory_path() / dir / (c.name + (by_layer ? "-by-layer" : "-whole"))).string();
  a.gradient_checkpointing = !c.checkpointing.is_null();
  if (a.gradient_checkpointing) a.gradient_checkpointing_kwargs = c.checkpointing;
  r.trainer = std::make_unique<Trainer>(r.model, a, data, data, options);
  return r;
}

// The bytes of unit u's compute weights (its buffer).
int64_t unit_bytes(const ModelParameters& p, size_t u) { return static_cast<int64_t>(p.units()[u].compute->bytes()); }

class ComputeByLayer : public ::testing::TestWithParam<Case> {};

}  // namespace

TEST_P(ComputeByLayer, TrainsBitwiseAsTheWholeCopyWithOneLayerHeldAtATime) {
  const Case& c = GetParam();
  auto data = tp::testing::synthetic_data(516, 8, 12);
  TrainingRun whole = start(c, false, data), by_layer = start(c, true, data);
  const ModelParameters& wp = whole.trainer->parameters();
  const ModelParameters& lp = by_layer.trainer->parameters();
  ASSERT_FALSE(wp.computes_by_unit()) << c.name << ": compute_copy_by_layer = false keeps the whole copy";
  ASSERT_EQ(whole.trainer->fsdp(), nullptr) << c.name;
  ASSERT_TRUE(lp.computes_by_unit()) << c.name;
  FullyShardedDataParallel* units = by_layer.trainer->fsdp();
  ASSERT_NE(units, nullptr) << c.name;
  ASSERT_FALSE(lp.fully_sharded()) << c.name;

  // The units' buffers hold every bf16 matrix once: together, the whole copy's size.
  int64_t largest = 0, all = 0, layers = 0;
  for (size_t u = 0; u < lp.units().size(); ++u) {
    largest = std::max(largest, unit_bytes(lp, u));
    all += unit_bytes(lp, u);
    layers += lp.units()[u].id >= 0 ? 1 : 0;
  }
  ASSERT_GE(layers, 2) << c.name << ": every decoder layer with a trained matrix is a unit";
  EXPECT_LT(largest, all) << c.name;

  for (int64_t step = 0; step < 3; ++step) {
    // Two micro-batches: the second forward and backward run on the same (unchanged) masters.
    std::vector<MicroBatch> mbs;
    for (int64_t k = 0; k < 2; ++k) {
      Tensor ids = data->batch({(4 * step + 2 * k) % data->size(), (4 * step + 2 * k + 1) % data->size()});
      mbs.push_back({ids, ids});
    }
    const StepResult a = whole.trainer->training_step(mbs);
    const StepResult b = by_layer.trainer->training_step(mbs);
    EXPECT_EQ(b.loss, a.loss) << c.name << " loss at step " << step;
    EXPECT_EQ(b.grad_norm, a.grad_norm) << c.name << " grad norm at step " << step;
    for (const TrainableParam& q : lp.params()) {
      const TrainableParam& p = wp.find(q.name);
      EXPECT_TRUE(equal(q.grad, p.grad)) << c.name << " gradient of " << q.name << " at step " << step
                                         << " (max diff " << max_abs_diff(q.grad, p.grad) << ")";
    }
    for (size_t u = 0; u < lp.units().size(); ++u)
      EXPECT_FALSE(lp.unit_gathered(u)) << c.name << ": unit " << lp.units()[u].id << " held after step " << step;
  }
  EXPECT_TRUE(equal(lp.full_masters(), wp.full_masters())) << c.name << ": the updated weights differ";
  EXPECT_EQ(units->max_gathered_layers(), 1) << c.name << ": layers' compute weights held at once";
  EXPECT_LE(units->peak_gathered_bytes(), largest) << c.name << ": more than one unit's compute weights at once";
  EXPECT_GT(units->peak_gathered_bytes(), 0) << c.name;

  // Evaluation (no gradients) rounds the updated masters too, and leaves no unit held.
  const nlohmann::json we = whole.trainer->evaluate(), le = by_layer.trainer->evaluate();
  EXPECT_EQ(le["eval_loss"].get<double>(), we["eval_loss"].get<double>()) << c.name;
  for (size_t u = 0; u < lp.units().size(); ++u)
    EXPECT_FALSE(lp.unit_gathered(u)) << c.name << ": unit " << lp.units()[u].id << " held after evaluate";

  // Once the Trainer is gone the model computes on whole weights again: the same logits.
  Tensor ids = data->batch({0});
  by_layer.trainer.reset();
  whole.trainer.reset();
  EXPECT_TRUE(equal(by_layer.model.lm().forward_ids(ids).logits, whole.model.lm().forward_ids(ids).logits))
      << c.name << ": the model after training";
}

INSTANTIATE_TEST_SUITE_P(
    Models, ComputeByLayer,
    ::testing::Values(Case{"qwen3_tied_native", "qwen3", true}, Case{"qwen3_tied_f32_values", "qwen3", false},
                      Case{"llama_untied_native", "llama", true},
                      Case{"llama_selective", "llama", true, {{"policy", "selective"}}},
                      Case{"qwen3_full_f32_values", "qwen3", false, {{"policy", "full"}}},
                      Case{"llama_lora", "llama", true, nullptr, true}),
    case_name);
