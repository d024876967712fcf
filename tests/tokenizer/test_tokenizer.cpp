// Unit tests of the tokenizer stages on small hand-made tokenizer.json files,
// plus errors for malformed files. The real-model tests are in
// test_conformance.cpp.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <thread>

#include "tokenizer/test_util.h"
#include "tp/core/error.h"
#include "tp/tokenizer/byte_level.h"
#include "tp/tokenizer/pre_tokenizer.h"
#include "tp/tokenizer/regex.h"
#include "tp/tokenizer/streaming_decoder.h"
#include "tp/tokenizer/tokenizer.h"
#include "tp/tokenizer/utf8.h"

namespace tp {
namespace {

using nlohmann::json;
using Ids = std::vector<int64_t>;

// A byte-level BPE tokenizer: ids 0..255 are the byte characters, then one id
// per merge in order. `merges` are pairs of plain (unmapped) strings.
json byte_level_tokenizer(const std::vector<std::pair<std::string, std::string>>& merges) {
  json vocab = json::object();
  for (int b = 0; b < 256; ++b) vocab[byte_level::byte_to_chars()[b]] = b;
  json m = json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    const auto ea = byte_level::encode(a), eb = byte_level::encode(b);
    if (!vocab.contains(ea + eb)) vocab[ea + eb] = next++;
    m.push_back(json::array({ea, eb}));
  }
  return {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}},
          {"pre_tokenizer",
           {{"type", "Sequence"},
            {"pretokenizers",
             json::array({{{"type", "Split"},
                           {"pattern", {{"Regex", R"(\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"}}},
                           {"behavior", "Isolated"},
                           {"invert", false}},
                          {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}})}}},
          {"decoder", {{"type", "ByteLevel"}}},
          {"added_tokens", json::array()}};
}

Tokenizer load(const json& j, const json& config = json()) {
  return Tokenizer::from_json_text(j.dump(), config.is_null() ? "" : config.dump());
}

std::vector<std::string> pieces(const json& pre_tokenizer, std::string_view text) {
  std::vector<std::string> out;
  PreTokenizer::from_json(pre_tokenizer)->pre_tokenize(text, true, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

std::string error_of(const std::function<void()>& fn) {
  try {
    fn();
  } catch (const Error& e) {
    return e.what();
  }
  return "(no error)";
}

TEST(Utf8, ReplacesMaximalIllFormedSubparts) {
  EXPECT_EQ(utf8::to_valid("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
  EXPECT_EQ(utf8::to_valid("\xE2\x82"), "\xEF\xBF\xBD");                  // truncated: one U+FFFD
  EXPECT_EQ(utf8::to_valid("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");      // overlong: two
  EXPECT_EQ(utf8::to_valid("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");  // surrogate: three
  EXPECT_EQ(utf8::to_valid("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
  EXPECT_EQ(utf8::complete_prefix_length("ab\xF0\x9F\x98"), 2u);
  EXPECT_EQ(utf8::complete_prefix_length("ab\xF0\x9F\x98\x80"), 6u);
}

TEST(Regex, WhiteSpaceFollowsOniguruma) {
  const Regex s("\\s+", "test");
  EXPECT_EQ(s.find_all("a\xC2\x85" "b").size(), 1u);   // U+0085 is White_Space
  EXPECT_TRUE(s.find_all("a\xE1\xA0\x8E" "b").empty());  // U+180E is not (PCRE2's \h says it is)
  EXPECT_TRUE(Regex("[^\\s]", "t").find_all(" \xE1\xA0\x8E").size() == 1u);
}

TEST(PreTokenizer, SplitBehaviours) {
  auto split = [](const char* behavior, bool invert = false) {
    return json{{"type", "Split"}, {"pattern", {{"String", "-"}}}, {"behavior", behavior}, {"invert", invert}};
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces(split("Isolated"), "a-b--c"), (V{"a", "-", "b", "-", "-", "c"}));
  EXPECT_EQ(pieces(split("Removed"), "a-b--c"), (V{"a", "b", "c"}));
  EXPECT_EQ(pieces(split("MergedWithPrevious"), "a-b--c"), (V{"a-", "b-", "-", "c"}));
  EXPECT_EQ(pieces(split("MergedWithNext"), "a-b--c"), (V{"a", "-b", "-", "-c"}));
  EXPECT_EQ(pieces(split("Contiguous"), "a-b--c"), (V{"a", "-", "b", "--", "c"}));
  EXPECT_EQ(pieces(split("Removed", true), "a-b--c"), (V{"-", "-", "-"}));
}

TEST(PreTokenizer, DigitsAndMetaspace) {
  using V = std::vector<std::string>;
  EXPECT_EQ(pieces({{"type", "Digits"}, {"individual_digits", true}}, "a12b"), (V{"a", "1", "2", "b"}));
  EXPECT_EQ(pieces({{"type", "Digits"}, {"individual_digits", false}}, "a12b"), (V{"a", "12", "b"}));
  EXPECT_EQ(pieces({{"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", "always"}}, "hi you"),
            (V{"\xE2\x96\x81hi", "\xE2\x96\x81you"}));
}

TEST(Bpe, LowestRankMergesFirstAndTiesGoLeft) {
  // "abc": (b,c) has the lower rank, so it wins over (a,b).
  const auto t1 = load(byte_level_tokenizer({{"b", "c"}, {"a", "b"}}));
  EXPECT_EQ(t1.encode("abc"), (Ids{'a', 256}));
  const auto t2 = load(byte_level_tokenizer({{"a", "b"}, {"b", "c"}}));
  EXPECT_EQ(t2.encode("abc"), (Ids{256, 'c'}));
  // "aaa" with (a,a): the left pair merges first.
  const auto t3 = load(byte_level_tokenizer({{"a", "a"}}));
  EXPECT_EQ(t3.encode("aaa"), (Ids{256, 'a'}));
  EXPECT_EQ(t3.decode(t3.encode("aaa")), "aaa");
}

TEST(Bpe, CachedWordsEncodeLikeFreshOnes) {
  // Many distinct words (more than the hot cache's 16K slots, so slots are
  // overwritten): a warm tokenizer must give each word the ids a fresh one gives.
  const json j = byte_level_tokenizer({{"a", "b"}, {"c", "d"}, {"ab", "cd"}, {"e", "e"}, {" ", "a"}});
  const auto warm = load(j);
  std::vector<std::string> words;
  for (int i = 0; i < 40000; ++i) {
    std::string w;
    for (int k = i; k > 0 || w.empty(); k /= 5) w += static_cast<char>('a' + k % 5);
    words.push_back(w);
  }
  for (const auto& w : words) (void)warm.encode(w);
  const auto fresh = load(j);
  for (size_t i = 0; i < words.size(); i += 7) ASSERT_EQ(warm.encode(words[i]), fresh.encode(words[i])) << words[i];
}

TEST(Bpe, IgnoreMergesTakesWholeWordsFromTheVocab) {
  json j = byte_level_tokenizer({{"a", "b"}});
  j["model"]["vocab"][byte_level::encode("abc")] = 300;  // reachable by no merge
  EXPECT_EQ(load(j).encode("abc"), (Ids{256, 'c'}));
  j["model"]["ignore_merges"] = true;
  EXPECT_EQ(load(j).encode("abc"), (Ids{300}));
}

TEST(Bpe, ByteFallbackForCharactersOutsideTheVocab) {
  json vocab = {{"<unk>", 0}, {"a", 1}};
  for (int b = 0; b < 256; ++b) vocab[fmt::format("<0x{:02X}>", b)] = 2 + b;
  const json j = {{"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", json::array()}, {"byte_fallback", true},
                             {"unk_token", "<unk>"}}},
                  {"decoder", {{"type", "Sequence"}, {"decoders", json::array({{{"type", "ByteFallback"}}, {{"type", "Fuse"}}})}}}};
  const auto t = load(j);
  EXPECT_EQ(t.encode("a\xC3\xA9"), (Ids{1, 2 + 0xC3, 2 + 0xA9}));
  EXPECT_EQ(t.decode({1, 2 + 0xC3, 2 + 0xA9}), "a\xC3\xA9");
  EXPECT_EQ(t.decode({1, 2 + 0xC3}), "a\xEF\xBF\xBD");  // an incomplete byte run becomes U+FFFD
}

TEST(AddedTokens, MatchedBeforeBpeWithStripOptions) {
  json j = byte_level_tokenizer({});
  j["added_tokens"] = json::array({{{"id", 300}, {"content", "<|x|>"}, {"special", true}},
                                   {{"id", 301}, {"content", "<|x|>y"}, {"special", true}},
                                   {{"id", 302}, {"content", "[L]"}, {"lstrip", true}, {"rstrip", true}}});
  const auto t = load(j);
  EXPECT_EQ(t.encode("a<|x|>b"), (Ids{'a', 300, 'b'}));
  EXPECT_EQ(t.encode("<|x|>yz"), (Ids{301, 'z'}));  // longest match wins
  EXPECT_EQ(t.encode("a  [L]  b"), (Ids{'a', 302, 'b'}));  // whitespace around [L] is absorbed
  EXPECT_EQ(t.decode({'a', 300, 'b'}), "a<|x|>b");
  EXPECT_EQ(t.decode({'a', 300, 'b'}, /*skip_special_tokens=*/true), "ab");
  EXPECT_TRUE(t.is_special(300));
  EXPECT_FALSE(t.is_special(302));
}

TEST(PostProcessor, TemplateAndConfigBosEos) {
  json j = byte_level_tokenizer({});
  j["added_tokens"] = json::array({{{"id", 300}, {"content", "<s>"}, {"special", true}},
                                   {{"id", 301}, {"content", "</s>"}, {"special", true}}});
  j["post_processor"] = {{"type", "TemplateProcessing"},
                         {"single", json::array({{{"SpecialToken", {{"id", "<s>"}, {"type_id", 0}}}},
                                                 {{"Sequence", {{"id", "A"}, {"type_id", 0}}}}})},
                         {"special_tokens", {{"<s>", {{"id", "<s>"}, {"ids", {300}}, {"tokens", {"<s>"}}}}}}};
  EXPECT_EQ(load(j).encode("a"), (Ids{300, 'a'}));
  EXPECT_EQ(load(j).encode("a", /*add_special_tokens=*/false), (Ids{'a'}));
  // tokenizer_config.json's add_bos_token/add_eos_token rebuild the template.
  const json config = {{"bos_token", "<s>"}, {"eos_token", {{"content", "</s>"}}}, {"add_bos_token", false},
                       {"add_eos_token", true}};
  const auto t = load(j, config);
  EXPECT_EQ(t.encode("a"), (Ids{'a', 301}));
  EXPECT_EQ(t.bos_token_id(), 300);
  EXPECT_EQ(t.eos_token_ids(), (Ids{301}));
  EXPECT_EQ(t.pad_token_id(), std::nullopt);
  // pad_token as an AddedToken dict, a vocabulary token, or one the vocabulary lacks.
  EXPECT_EQ(load(j, json{{"pad_token", {{"content", "</s>"}}}}).pad_token_id(), 301);
  EXPECT_EQ(load(j, json{{"pad_token", "a"}}).pad_token_id(), 'a');
  EXPECT_EQ(load(j, json{{"pad_token", "<pad>"}}).pad_token_id(), std::nullopt);
}

TEST(Encode, InvalidUtf8BecomesReplacementCharacter) {
  const auto t = load(byte_level_tokenizer({}));
  EXPECT_EQ(t.encode("a\xFF" "b"), t.encode("a\xEF\xBF\xBD" "b"));
  EXPECT_EQ(t.decode(t.encode("a\xFF" "b")), "a\xEF\xBF\xBD" "b");
}

TEST(Decode, CleanUpTokenizationSpaces) {
  // Only the listed contractions: " 't" is not one of them.
  EXPECT_EQ(clean_up_tokenization("a . b , c ' d don 't x n't I 'm"), "a. b, c'd don 't xn't I'm");
  const auto t = load(byte_level_tokenizer({}), json{{"clean_up_tokenization_spaces", true}});
  EXPECT_EQ(t.decode(t.encode("hi .")), "hi.");
  EXPECT_EQ(t.decode(t.encode("hi ."), false, false), "hi .");
}

TEST(StreamingDecoder, HoldsBackPartialUtf8) {
  const auto t = load(byte_level_tokenizer({}));
  StreamingDecoder s(t);
  EXPECT_EQ(s.push('a'), "a");
  EXPECT_EQ(s.push(0xF0), "");  // first byte of U+1F600
  EXPECT_EQ(s.push(0x9F), "");
  EXPECT_EQ(s.push(0x98), "");
  EXPECT_EQ(s.push(0x80), "\xF0\x9F\x98\x80");
  EXPECT_EQ(s.push(0xC3), "");
  EXPECT_EQ(s.flush(), "\xEF\xBF\xBD");  // still incomplete at the end
}

TEST(Tokenizer, ConcurrentEncodesAgree) {
  // encode is const and shares the word caches between threads.
  const auto t = load(byte_level_tokenizer({{"a", "b"}, {"ab", "c"}, {" ", "x"}}));
  std::string text;
  for (int i = 0; i < 3000; ++i) text += "abc xab " + std::to_string(i) + " cab ";
  const auto expected = load(byte_level_tokenizer({{"a", "b"}, {"ab", "c"}, {" ", "x"}})).encode(text);
  std::vector<std::vector<int64_t>> got(4);
  std::vector<std::thread> threads;
  for (int k = 0; k < 4; ++k) threads.emplace_back([&, k] { got[k] = t.encode(text); });
  for (auto& th : threads) th.join();
  for (const auto& g : got) EXPECT_EQ(g, expected);
}

TEST(Tokenizer, ModelFolderFilesGiveBosAndEosIds) {
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("tp_tok_{}", ::getpid());
  std::filesystem::create_directories(dir);
  json j = byte_level_tokenizer({});
  j["added_tokens"] = json::array({{{"id", 300}, {"content", "<s>"}, {"special", true}},
                                   {{"id", 301}, {"content", "</s>"}, {"special", true}},
                                   {{"id", 302}, {"content", "<eot>"}, {"special", true}}});
  std::ofstream(dir / "tokenizer.json") << j.dump();
  std::ofstream(dir / "tokenizer_config.json") << json{{"bos_token", "<s>"}, {"eos_token", "</s>"}}.dump();
  std::ofstream(dir / "generation_config.json") << json{{"eos_token_id", {301, 302}}}.dump();
  const auto t = Tokenizer::from_model_dir(dir);
  std::filesystem::remove_all(dir);
  EXPECT_EQ(t.bos_token_id(), 300);
  EXPECT_EQ(t.eos_token_ids(), (Ids{301, 302}));
  EXPECT_EQ(t.vocab_size(), 303);
  EXPECT_EQ(t.token_to_id("<eot>"), 302);
  EXPECT_EQ(t.id_to_token(302), "<eot>");
}

TEST(Errors, MalformedFilesNameTheProblem) {
  EXPECT_NE(error_of([] { Tokenizer::from_json_text("{ not json"); }).find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of([] { Tokenizer::from_json_text("[]"); }).find("top level must be a JSON object"),
            std::string::npos);
  json j = byte_level_tokenizer({{"a", "b"}});
  j["model"]["merges"].push_back(json::array({"zzz", "a"}));
  EXPECT_NE(error_of([&] { load(j); }).find("names token \"zzz\", which is not in the vocab"), std::string::npos);

  j = byte_level_tokenizer({});
  j["normalizer"] = {{"type", "Precompiled"}};
  const auto norm = error_of([&] { load(j); });
  EXPECT_NE(norm.find("normalizer type 'Precompiled' is not supported; supported: NFC"), std::string::npos) << norm;

  j = byte_level_tokenizer({});
  j["pre_tokenizer"] = {{"type", "BertPreTokenizer"}};
  EXPECT_NE(error_of([&] { load(j); }).find("pre_tokenizer type 'BertPreTokenizer' is not supported; supported:"),
            std::string::npos);
  j = byte_level_tokenizer({});
  j["decoder"] = {{"type", "CTC"}};
  EXPECT_NE(error_of([&] { load(j); }).find("decoder type 'CTC' is not supported"), std::string::npos);
  j = byte_level_tokenizer({});
  j["post_processor"] = {{"type", "Foo"}};
  EXPECT_NE(error_of([&] { load(j); }).find("post_processor type 'Foo' is not supported"), std::string::npos);
  j = byte_level_tokenizer({});
  j["model"]["type"] = "WordPiece";
  EXPECT_NE(error_of([&] { load(j); }).find("model type 'WordPiece' is not supported; supported: BPE"),
            std::string::npos);
  j = byte_level_tokenizer({});
  j["model"]["vocab"] = json::array();
  EXPECT_NE(error_of([&] { load(j); }).find("vocab must be an object"), std::string::npos);
  j = byte_level_tokenizer({});
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"Regex", "(unclosed"}};
  EXPECT_NE(error_of([&] { load(j); }).find("does not compile"), std::string::npos);
  j = byte_level_tokenizer({});
  j["model"]["merges"] = 7;
  EXPECT_NE(error_of([&] { load(j); }).find("merges must be an array"), std::string::npos);
  j = byte_level_tokenizer({});
  j["model"]["vocab"]["x"] = "seven";  // wrong type
  EXPECT_NE(error_of([&] { load(j); }).find("malformed"), std::string::npos);

  EXPECT_NE(error_of([] { Tokenizer::from_file("/nonexistent/tokenizer.json"); }).find("does not exist"),
            std::string::npos);
  const auto t = load(byte_level_tokenizer({}));
  EXPECT_NE(error_of([&] { t.decode({5000}); }).find("cannot decode token id 5000"), std::string::npos);
}

TEST(StreamingDecoder, PrimedWithThePromptTheContinuationKeepsItsLeadingSpace) {
  // Llama 2 (Metaspace): decoding a continuation alone strips its first space
  // ("be"); decoded after the prompt it is " be", as the full text has it.
  const auto path = test::real_tokenizer("llama2");
  if (!path) GTEST_SKIP() << "tokenizer files not installed: run scripts/install-npm-deps";
  const Tokenizer t = Tokenizer::from_file(*path);
  const std::vector<int64_t> prompt = t.encode("The best way to"), more = t.encode("be happy", false);
  StreamingDecoder alone(t), primed(t);
  primed.prime(prompt);
  std::string a, b;
  for (int64_t id : more) {
    a += alone.push(id);
    b += primed.push(id);
  }
  a += alone.flush();
  b += primed.flush();
  EXPECT_EQ(a, "be happy");
  EXPECT_EQ(b, " be happy");
  std::vector<int64_t> all = prompt;
  all.insert(all.end(), more.begin(), more.end());
  EXPECT_EQ(t.decode(prompt, true) + b, t.decode(all, true));
}

}  // namespace
}  // namespace tp
