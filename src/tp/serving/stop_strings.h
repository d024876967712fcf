#pragma once
// Stop strings (OpenAI's `stop`): the completion ends at the first occurrence
// of any of them and the text is cut before it, as OpenAI and vLLM do. Text
// arrives in pieces (one token's worth at a time), so a piece that could be
// the start of a stop string is held back until the next piece decides.
#include <string>
#include <string_view>
#include <vector>

namespace tp::serving {

class StopMatcher {
 public:
  explicit StopMatcher(std::vector<std::string> stops);
  // Appends `text`; returns what is now final: everything before a stop string
  // (then stopped() is true and later pushes return nothing), or everything but
  // the longest tail that begins some stop string.
  std::string push(std::string_view text);
  bool stopped() const { return stopped_; }
  // The generation ended without a stop: the held-back tail.
  std::string flush();

 private:
  std::vector<std::string> stops_;
  std::string held_;
  bool stopped_ = false;
};

}  // namespace tp::serving
