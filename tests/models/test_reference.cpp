// tp = 1 against the independent PyTorch forward (tests/reference/): the golden
// logits that script wrote for the same tiny checkpoints and input ids.
#include <gtest/gtest.h>

#include <cstdlib>

#include "tp/io/safetensors.h"
#include "tp/models/auto.h"

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
                         ::testing::Values("llama", "llama-mlp-bias", "mistral", "qwen3", "qwen3-window", "mixtral",
                                          "qwen3_moe", "qwen3_moe-window", "deepseek_v2", "deepseek_v2-q-lora",
                                          "deepseek_v3", "gpt_oss", "gpt_oss-mxfp4", "qwen3_moe-route",
                                          "qwen3_moe-route-norm", "mixtral-route", "gpt_oss-route",
                                          "deepseek_v2-route", "deepseek_v3-route", "deepseek_v3-route-nonorm"));
