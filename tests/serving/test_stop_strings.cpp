// Stop strings cut the completion before the first match, also across the
// pieces text arrives in; CompletionText does it on decoded tokens.
#include <gtest/gtest.h>

#include "tp/serving/completion_text.h"
#include "tp/serving/stop_strings.h"

using namespace tp::serving;

TEST(StopMatcher, CutsBeforeTheFirstStopAcrossPieces) {
  StopMatcher m({"END", "\n\n"});
  EXPECT_EQ(m.push("Hello E"), "Hello ");  // "E" may begin END: held back
  EXPECT_EQ(m.push("N"), "");
  EXPECT_EQ(m.push("Dless"), "");  // "END" matched: nothing after it
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(m.push("more"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopMatcher, ReleasesAHeldTailThatIsNoStop) {
  StopMatcher m({"abc"});
  EXPECT_EQ(m.push("xab"), "x");
  EXPECT_EQ(m.push("d"), "abd");
  EXPECT_EQ(m.push("a"), "");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.flush(), "a");
  // The earliest match wins, whichever stop string it is.
  StopMatcher two({"cd", "b"});
  EXPECT_EQ(two.push("abcd"), "a");
  StopMatcher none({});
  EXPECT_EQ(none.push("anything"), "anything");
}

TEST(CompletionText, DecodesTokensAndStops) {
  tp::Tokenizer tok = tp::Tokenizer::from_file(TP_QWEN3_TOKENIZER);
  std::vector<int64_t> prompt = tok.encode("The answer:");
  std::vector<int64_t> ids = tok.encode(" forty two. Next line");
  CompletionText whole(&tok, prompt, {});
  std::string text;
  for (int64_t id : ids) text += whole.push({id});
  text += whole.finish();
  EXPECT_EQ(text, " forty two. Next line");
  EXPECT_EQ(whole.tokens(), ids);

  CompletionText cut(&tok, prompt, {". N"});
  text.clear();
  for (int64_t id : ids) text += cut.push({id});
  text += cut.finish();
  EXPECT_EQ(text, " forty two");
  EXPECT_TRUE(cut.stopped());
  EXPECT_LT(cut.tokens().size(), ids.size());  // the tokens after the stop are not the completion's

  CompletionText raw(nullptr, {1}, {});
  EXPECT_EQ(raw.push({7, 12}), "7 12 ");
}
