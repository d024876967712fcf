// tp = 1 against the independent PyTorch forward (tests/reference/): the golden
// logits that script wrote for the same tiny checkpoints and input ids.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "tp/io/safetensors.h"
#include "tp/models/checkpoint.h"
#include "tp/models/auto.h"
#include "tp/nn/moe.h"

using namespace tp;

namespace {

std::string env(const char* name) {
  const char* v = std::getenv(name);
  if (v == nullptr) throw Error(fmt::format("{} is not set (CTest sets it)", name));
  return v;
}

class Reference : public ::testing::TestWithParam<std::string> {};

}  // namespace

TEST_P(Reference, Tp1MatchesPyTorch) {
  auto golden = io::SafetensorsFile::open(env("TP_GOLDEN_DIR") + "/" + GetParam() + ".safetensors");
  Tensor want = golden->read("logits", DType::F32);
  std::vector<int64_t> ids;
  for (float v : golden->read("input_ids", DType::F32).to_vector()) ids.push_back(static_cast<int64_t>(v));
  PretrainedModel model =
      AutoModelForCausalLM::from_pretrained(env("TP_TEST_MODELS") + "/" + GetParam(), {.verbose = false});
  Tensor got = model.forward(Tensor::from_ints(ids, {1, static_cast<int64_t>(ids.size())}));
  got = got.reshape(want.shape());
  double scale = max_abs(want), diff = max_abs_diff(got, want);
  EXPECT_GT(scale, 0.1);
  EXPECT_LE(diff, 1e-4 * scale) << GetParam() << ": max |tp - torch| " << diff << " (max |logit| " << scale << ")";
}

INSTANTIATE_TEST_SUITE_P(Tiny, Reference,
                         ::testing::Values("llama", "llama-mlp-bias", "mistral", "qwen3", "qwen3-window", "qwen2", "mixtral",
                                          "qwen3_moe", "qwen3_moe-window", "deepseek_v2", "deepseek_v2-q-lora",
                                          "deepseek_v3", "gpt_oss", "gpt_oss-mxfp4", "qwen3_moe-route",
                                          "qwen3_moe-route-norm", "mixtral-route", "gpt_oss-route",
                                          "deepseek_v2-route", "deepseek_v3-route", "deepseek_v3-route-nonorm",
                                          "phi3", "phi3-long", "phi3-window",
                                          // sandwich norms, local / global rope, soft-capped logits
                                          "gemma3"));

// Gemma3ForConditionalGeneration's files (make_gemma3_vlm.py: Google's language_model.model.* and Transformers
// v5's model.language_model.*, a sparse text_config, a vision tower) read as their language model: the text
// model's config and exactly its logits; the vision tensors are not the model's.
TEST(Gemma3Multimodal, ReadsItsLanguageModel) {
  const std::string dir = env("TP_TEST_MODELS") + "/";
  const Tensor ids = Tensor::from_ints({1, 17, 42, 99, 250, 3, 511, 7}, {1, 8});
  PretrainedModel text = AutoModelForCausalLM::from_pretrained(dir + "gemma3", {.verbose = false});
  const Tensor want = text.forward(ids);
  for (const char* name : {"gemma3-vlm", "gemma3-vlm-v5"}) {
    const Checkpoint ckpt = Checkpoint::open(dir + name);
    EXPECT_EQ(ckpt.config().model_type, "gemma3_text") << name;
    EXPECT_EQ(ckpt.config().num_hidden_layers, 2) << name;
    EXPECT_DOUBLE_EQ(ckpt.config().rope_theta, 1e6) << name;  // Gemma3TextConfig's default: the key was dropped
    EXPECT_TRUE(ckpt.has("model.embed_tokens.weight")) << name;
    for (const std::string& t : ckpt.tensor_names())
      EXPECT_EQ(t.rfind("model.layers.", 0) == 0 || t == "model.embed_tokens.weight" || t == "model.norm.weight", true)
          << name << ": " << t;
    PretrainedModel vlm = AutoModelForCausalLM::from_pretrained(dir + name, {.verbose = false});
    EXPECT_EQ(max_abs_diff(vlm.forward(ids), want), 0.0) << name;
  }
}

// LongRoPE's factors follow each call's length, as Transformers' dynamic update picks
// them: a prefill within the original context (2 positions) caches keys turned by
// short_factor; the step after it reaches past it, and its query and key turn by
// long_factor. The reference computes that step (its step_logits).
TEST(Phi3LongRope, ACachedStepPastTheOriginalContextUsesLongFactors) {
  auto golden = io::SafetensorsFile::open(env("TP_GOLDEN_DIR") + "/phi3-long.safetensors");
  Tensor want = golden->read("step_logits", DType::F32);
  std::vector<int64_t> ids;
  for (float v : golden->read("input_ids", DType::F32).to_vector()) ids.push_back(static_cast<int64_t>(v));
  PretrainedModel model =
      AutoModelForCausalLM::from_pretrained(env("TP_TEST_MODELS") + "/phi3-long", {.verbose = false});
  KVState state = model.lm().make_kv_state(1, 8);
  model.forward(Tensor::from_ints({ids[0], ids[1]}, {1, 2}), {.cache = &state});
  Tensor got = model.forward(Tensor::from_ints({ids[2]}, {1, 1}), {.cache = &state}).logits.reshape(want.shape());
  double scale = max_abs(want), diff = max_abs_diff(got, want);
  EXPECT_GT(scale, 0.1);
  EXPECT_LE(diff, 1e-4 * scale) << "max |tp - torch| " << diff << " (max |logit| " << scale << ")";
}

// GPT-OSS's MXFP4 experts at inference stay packed (ops::QuantizedLinear::e2m1 an expert: codes and f16 scales,
// ~4.5 bits a weight) and give the logits of the same checkpoint loaded for training, whose experts are
// dequantised to f32, within 1e-4 of the largest (an expert's few rows run decode's kernels, x quantized to 16 bits
// where AVX512-VNNI is); Tp1MatchesPyTorch holds the packed ones to the golden logits.
TEST(Mxfp4Experts, StayPackedAtInference) {
  const std::string dir = env("TP_TEST_MODELS") + "/gpt_oss-mxfp4";
  PretrainedModel packed = AutoModelForCausalLM::from_pretrained(dir, {.verbose = false});
  PretrainedModel plain = AutoModelForCausalLM::from_pretrained(dir, LoadOptions::for_training());
  int layers = 0;
  for (nn::Module* m : packed.lm().modules())
    if (auto* experts = dynamic_cast<nn::MoeExperts*>(m)) {
      ++layers;
      ASSERT_TRUE(experts->packed()) << m->name();
      EXPECT_FALSE(experts->gate_up_proj.data.defined());
      const int64_t E = experts->num_experts(), H = experts->hidden_size();
      const int64_t I = experts->gate_up_proj.global_shape[2] / 2;
      EXPECT_EQ(experts->packed_bytes(), static_cast<size_t>(E) * (ops::QuantizedLinear::e2m1_resident_bytes(2 * I, H) +
                                                                   ops::QuantizedLinear::e2m1_resident_bytes(H, I)));
      // Codes (half a byte a weight) and one f16 scale a block of 32: 4.5 bits a weight, against 32 dequantised.
      EXPECT_EQ(experts->packed_bytes() * 8, static_cast<size_t>(E * 3 * I * H) * 9 / 2);
    }
  EXPECT_EQ(layers, 2);
  for (nn::Module* m : plain.lm().modules())
    if (auto* experts = dynamic_cast<nn::MoeExperts*>(m)) EXPECT_FALSE(experts->packed()) << m->name();
  const Tensor ids = Tensor::from_ints({1, 7, 300, 42, 5, 260, 9, 17}, {1, 8});
  const Tensor a = packed.forward(ids), b = plain.forward(ids);
  ASSERT_EQ(a.shape(), b.shape());
  double scale = 0, diff = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    scale = std::max(scale, std::fabs(double{b.data<float>()[i]}));
    diff = std::max(diff, std::fabs(double{a.data<float>()[i]} - b.data<float>()[i]));
  }
  EXPECT_GT(scale, 0.1);
  EXPECT_LE(diff, 1e-4 * scale) << "packed experts against dequantised ones: " << diff << " of " << scale;
}
