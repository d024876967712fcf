// libFuzzer target for chat templates: any template text must render or end in
// a tp::Error (naming the template and a line), never a crash, a hang or a
// stack overflow. Each input is rendered over a fixed two-turn conversation
// with and without the generation prompt.
#include <cstddef>
#include <cstdint>
#include <string>

#include "tp/chat/chat_template.h"
#include "tp/core/error.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  static const nlohmann::json messages = {{{"role", "system"}, {"content", "Be brief."}},
                                          {{"role", "user"}, {"content", "Hi \"there\"\n"}},
                                          {{"role", "assistant"}, {"content", "<think>x</think>Hello"}},
                                          {{"role", "user"}, {"content", "caf\xC3\xA9?"}}};
  try {
    const auto t = tp::chat::ChatTemplate::from_string(source, "fuzz", {{"bos_token", "<s>"}, {"eos_token", "</s>"}});
    for (bool add_generation_prompt : {false, true}) {
      try {
        t.apply(messages, add_generation_prompt, {{"enable_thinking", false}});
      } catch (const tp::Error&) {
      }
    }
  } catch (const tp::Error&) {
  }
  return 0;
}
