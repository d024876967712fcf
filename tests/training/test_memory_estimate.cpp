// --estimate-memory's prediction against the allocator's measured high-water mark
// of a training step (every tensor byte live at the step's peak, state included),
// over a grid: Llama and Qwen3 shapes, 64 and 512 tokens, f32 and bf16 compute,
// checkpointing off / full / selective, at tp = world size (CTest runs 1 and 2
// ranks), sequence parallelism at tp 2. Each point must be within 15%.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <filesystem>

#include "models/model_test_util.h"
#include "training/training_test_util.h"
#include "tp/distributed/parallelism_config.h"
#include "tp/models/auto.h"
#include "tp/training/memory_estimate.h"
#include "tp/training/trainer.h"

using namespace tp;
using namespace tp::training;
using tp::testing::model_dir;

namespace {

struct Point {
  std::string model;
  int64_t seq;
  bool bf16;
  std::string policy;  // off, full, selective
  bool sequence_parallel = false;
  bool fsdp = false;  // at np 2: FSDP over dp_shard 2 x tp 1
};

std::string point_name(const ::testing::TestParamInfo<Point>& info) {
  const Point& p = info.param;
  std::string m = p.model;
  std::replace(m.begin(), m.end(), '-', '_');
  return m + "_T" + std::to_string(p.seq) + (p.bf16 ? "_bf16_" : "_f32_") + p.policy + (p.sequence_parallel ? "_sp" : "") +
         (p.fsdp ? "_fsdp" : "");
}

class MemoryEstimateGrid : public ::testing::TestWithParam<Point> {};

}  // namespace

TEST_P(MemoryEstimateGrid, PredictsTheMeasuredPeakWithin15Percent) {
  const Point& p = GetParam();
  if (p.sequence_parallel && dist::world_size() == 1) GTEST_SKIP() << "sequence parallelism needs tp > 1";
  if (p.fsdp && dist::world_size() != 2) GTEST_SKIP() << "FSDP points run at dp_shard 2";
  LoadOptions o = LoadOptions::for_training();
  o.verbose = false;
  if (p.fsdp) o.mesh = dist::ParallelismConfig{1, 2, 1}.build_device_mesh();
  o.distributed_config.enable_sequence_parallel = p.sequence_parallel;
  PretrainedModel model = AutoModelForCausalLM::from_pretrained(model_dir(p.model), o);
  auto data = tp::testing::synthetic_data(model.config().vocab_size, 4, p.seq);
  TrainingArguments a;
  a.output_dir = (std::filesystem::temp_directory_path() / ("tp-test-memest-" + std::to_string(::getppid())) /
                  point_name({p, 0}))
                     .string();
  a.per_device_train_batch_size = 1;
  a.save_strategy = "no";
  a.bf16 = p.bf16;
  a.gradient_checkpointing = p.policy != "off";
  if (a.gradient_checkpointing) a.gradient_checkpointing_kwargs = {{"policy", p.policy}};
  if (p.fsdp) a.fsdp = "full_shard";
  Trainer trainer(model, a, data);
  int64_t peak = 0;
  for (int64_t step = 0; step < 2; ++step) {
    Tensor ids = data->batch({step});
    reset_peak_tensor_bytes();
    trainer.training_step({{ids, ids}});
    peak = static_cast<int64_t>(allocator_stats().peak_tensor_bytes);
  }
  MemoryEstimateInputs in;
  in.config = model.config();
  in.distributed.tp_size = model.tp_size();
  in.distributed.enable_sequence_parallel = p.sequence_parallel;
  in.dp_shard_size = p.fsdp ? 2 : 1;
  in.fsdp = p.fsdp;
  in.seq_len = p.seq;
  in.batch_size = 1;
  in.bf16 = p.bf16;
  in.bf16_native = trainer.parameters().bf16_native();
  in.compute_copy_by_layer = trainer.parameters().computes_by_unit() && !p.fsdp;  // the Trainer's default under bf16
  in.checkpointing = a.checkpointing();
  in.fused_loss = trainer.fused_loss();
  const MemoryEstimate e = estimate_training_memory(in);
  if (dist::world_rank() == 0)
    std::printf("%s tp %lld: predicted %.2f MiB (state %.2f, activations %.2f), measured %.2f MiB (%.3fx)\n",
                point_name({p, 0}).c_str(), static_cast<long long>(model.tp_size()), e.total / 1048576.0,
                (e.weights + e.gradients + e.optimizer) / 1048576.0, e.activations / 1048576.0, peak / 1048576.0,
                static_cast<double>(e.total) / static_cast<double>(peak));
  EXPECT_NEAR(static_cast<double>(e.total), static_cast<double>(peak), 0.15 * static_cast<double>(peak))
      << point_name({p, 0}) << " at tp " << model.tp_size() << ": predicted " << e.total << ", measured " << peak
      << " (" << e.to_json().dump() << ")";
}

INSTANTIATE_TEST_SUITE_P(
    Grid, MemoryEstimateGrid,
    ::testing::Values(Point{"qwen3-mem", 64, false, "off"}, Point{"qwen3-mem", 512, false, "off"},
                      Point{"qwen3-mem", 512, true, "off"}, Point{"qwen3-mem", 512, true, "full"},
                      Point{"qwen3-mem", 512, true, "selective"}, Point{"qwen3-mem", 512, false, "selective"},
                      Point{"llama-mem", 512, true, "off"}, Point{"llama-mem", 512, true, "full"},
                      Point{"llama-mem", 64, true, "selective"}, Point{"qwen3-mem", 512, true, "off", true},
                      Point{"qwen3-mem", 512, true, "full", true}, Point{"qwen3-mem", 512, true, "full", false, true},
                      Point{"qwen3-mem", 512, false, "off", false, true},
                      Point{"llama-mem", 512, true, "selective", false, true}),
    point_name);

TEST(MemoryEstimate, NamesWhatItCannotEstimate) {
  ModelConfig c = ModelConfig::load(model_dir("mixtral") + "/config.json");
  MemoryEstimateInputs in;
  in.config = c;
  try {
    estimate_training_memory(in);
    FAIL() << "a MoE model was estimated";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("not model_type 'mixtral'"), std::string::npos) << e.what();
  }
}
