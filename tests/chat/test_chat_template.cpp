// The Jinja subset of tp::chat, construct by construct. Expected outputs are
// those of @huggingface/jinja with Transformers.js's options (trim_blocks,
// lstrip_blocks), which differ from Python Jinja in a few printed forms
// (true/false, none as "").
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "tp/chat/chat_template.h"
#include "tp/core/error.h"

namespace {

using tp::chat::ChatTemplate;
using json = nlohmann::json;
using Messages = std::vector<tp::chat::Message>;

std::string render(const std::string& source, const json& vars = json::object()) {
  return ChatTemplate::from_string(source, "t").apply(json::array(), false, vars);
}

// The error message of rendering `source` ("" when it renders).
std::string error_of(const std::string& source, const json& vars = json::object()) {
  try {
    render(source, vars);
  } catch (const tp::Error& e) {
    return e.what();
  }
  return "";
}

TEST(ChatTemplate, TextAndExpressions) {
  EXPECT_EQ(render("plain text"), "plain text");
  EXPECT_EQ(render("{{ 1 + 2 }} {{ 7 // 2 }} {{ 7 % 3 }} {{ 7 / 2 }} {{ 2 * 3.0 }} {{ 2 ** 3 }}"), "3 3 1 3.5 6.0 8");
  EXPECT_EQ(render("{{ 'a' ~ 1 ~ true }} {{ 'x' + 2 }}"), "a1true x2");
  EXPECT_EQ(render("{{ -3 }} {{ -(1 + 2) }} {{ 1.5 }}"), "-3 -3 1.5");
  EXPECT_EQ(render("{{ true }} {{ none }} {{ [1, 'a'] }} {{ {'k': 1} }}"), "true  [1, \"a\"] {\"k\": 1}");
  EXPECT_EQ(render("{{ 'ab' 'cd' }}"), "abcd");
}

TEST(ChatTemplate, StringLiteralEscapes) {
  EXPECT_EQ(render(R"({{ 'a\nb\t\'c\' "d" \\ \x41 \u00e9' }})"), "a\nb\t'c' \"d\" \\ A \xC3\xA9");
  EXPECT_EQ(render(R"({{ "it's" }})"), "it's");
}

TEST(ChatTemplate, ComparisonsAndLogic) {
  EXPECT_EQ(render("{{ 1 < 2 }} {{ 2 >= 3 }} {{ 1 == 1.0 }} {{ 'a' != 'b' }} {{ none == x }}"), "true false true true true");
  EXPECT_EQ(render("{{ 0 or 'y' }} {{ 1 and 'z' }} {{ not 0 }} {{ [] or 'empty' }}"), "y z true empty");
  EXPECT_EQ(render("{{ 'b' in 'abc' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }} {{ 3 not in [1] }}"), "true true true true");
  EXPECT_EQ(render("{{ 'yes' if 1 > 0 else 'no' }}{{ 'never' if false }}"), "yes");
}

TEST(ChatTemplate, IfElifElse) {
  const std::string t = "{% if x == 1 %}one{% elif x == 2 %}two{% else %}many{% endif %}";
  EXPECT_EQ(render(t, {{"x", 1}}), "one");
  EXPECT_EQ(render(t, {{"x", 2}}), "two");
  EXPECT_EQ(render(t, {{"x", 5}}), "many");
}

TEST(ChatTemplate, ForLoops) {
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{{ loop.index0 }}{{ loop.index }}{{ x }}{% if not loop.last %},{% endif %}{% endfor %}"),
            "011,122,233");
  EXPECT_EQ(render("{% for x in xs %}{{ loop.first }}/{{ loop.length }} {% endfor %}", {{"xs", {5, 6}}}), "true/2 false/2 ");
  EXPECT_EQ(render("{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}", {{"d", {{"a", 1}, {"b", 2}}}}), "a=1;b=2;");
  EXPECT_EQ(render("{% for k in d %}{{ k }}{% endfor %}", {{"d", {{"a", 1}, {"b", 2}}}}), "ab");
  EXPECT_EQ(render("{% for x in [1, 2, 3, 4] if x % 2 == 0 %}{{ x }}{{ loop.index }}{% endfor %}"), "2142");
  EXPECT_EQ(render("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(render("{% for x in [1, 2, 3] %}{% if x == 2 %}{% continue %}{% endif %}{% if x == 3 %}{% break %}{% endif %}{{ x }}{% endfor %}"),
            "1");
  EXPECT_EQ(render("{% for m in messages[::-1] %}{{ m }}{% endfor %}", {{"messages", {"a", "b", "c"}}}), "cba");
}

TEST(ChatTemplate, SetAndNamespace) {
  EXPECT_EQ(render("{% set x = 'a' %}{% set y = x ~ 'b' %}{{ y }}"), "ab");
  EXPECT_EQ(render("{% set a, b = [1, 2] %}{{ b }}{{ a }}"), "21");
  // A set inside a loop stays in the loop; a namespace carries values out.
  EXPECT_EQ(render("{% set x = 0 %}{% for i in [1, 2] %}{% set x = i %}{% endfor %}{{ x }}"), "0");
  EXPECT_EQ(render("{% set ns = namespace(x=0, s='') %}{% for i in [1, 2] %}{% set ns.x = ns.x + i %}{% endfor %}{{ ns.x }}"),
            "3");
  EXPECT_EQ(render("{% set block %}in {{ 1 }}{% endset %}[{{ block }}]"), "[in 1]");
}

TEST(ChatTemplate, Macros) {
  EXPECT_EQ(render("{% macro greet(name, punct='!') %}Hi {{ name }}{{ punct }}{% endmacro %}{{ greet('Bo') }} {{ greet('Al', punct='?') }}"),
            "Hi Bo! Hi Al?");
}

TEST(ChatTemplate, SubscriptsAndSlices) {
  const json vars = {{"xs", {1, 2, 3, 4}}, {"s", "héllo"}, {"d", {{"k", "v"}}}};
  EXPECT_EQ(render("{{ xs[0] }}{{ xs[-1] }}{{ xs[1:3] }}{{ xs[:2] }}{{ xs[::2] }}{{ xs[::-1] }}", vars), "14[2, 3][1, 2][1, 3][4, 3, 2, 1]");
  EXPECT_EQ(render("{{ s[1] }}{{ s[1:3] }}{{ s[::-1] }}", vars), "\xC3\xA9\xC3\xA9l" "oll\xC3\xA9h");
  EXPECT_EQ(render("{{ d['k'] }}{{ d.k }}{{ d.missing }}|{{ xs[10] }}|", vars), "vv||");
  // Bytes that are not UTF-8 in the template's own text slice as U+FFFD each (fuzz_chat_template: a
  // literal with byte 0xF9 sliced into an endless loop).
  EXPECT_EQ(render("{{ 'a\xF9" "b'[1:] }}|{{ 'a\xE2\x82'[::-1] }}", {}), "\xEF\xBF\xBD" "b|\xEF\xBF\xBD" "a");
}

TEST(ChatTemplate, StringMethods) {
  EXPECT_EQ(render("{{ '  a b  '.strip() }}|{{ '  a'.lstrip() }}|{{ 'a  '.rstrip() }}|"), "a b|a|a|");
  EXPECT_EQ(render("{{ 'a,b,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a,b,c'.split(',', 1) }}"),
            "[\"a\", \"b\", \"c\"] [\"a\", \"b\"] [\"a\", \"b,c\"]");
  EXPECT_EQ(render("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith('bc') }} {{ 'abc'.startswith(('x', 'a')) }}"), "true true true");
  EXPECT_EQ(render("{{ 'aBc'.upper() }} {{ 'AbC'.lower() }} {{ 'hello world'.title() }} {{ 'éa'.upper() }}"), "ABC abc Hello World \xC3\x89" "A");
  EXPECT_EQ(render("{{ 'aXbX'.replace('X', '-') }} {{ 'aXbX'.replace('X', '-', 1) }}"), "a-b- a-bX");
  EXPECT_EQ(render("{{ 'abc'.length }}"), "3");
}

TEST(ChatTemplate, DictMethods) {
  const json vars = {{"d", {{"a", 1}, {"b", 2}}}};
  EXPECT_EQ(render("{{ d.get('a') }} {{ d.get('z', 'none') }} {{ d.get('z') is none }}", vars), "1 none true");
  EXPECT_EQ(render("{{ d.keys() }} {{ d.values() }} {{ d.items() }}", vars), "[\"a\", \"b\"] [1, 2] [[\"a\", 1], [\"b\", 2]]");
}

TEST(ChatTemplate, Filters) {
  const json vars = {{"xs", {"a", "b"}}, {"ms", {{{"role", "user"}, {"c", 1}}, {{"role", "tool"}}}}};
  EXPECT_EQ(render("{{ '  x '|trim }}|{{ xs|length }}|{{ 'abc'|length }}|{{ xs|first }}{{ xs|last }}|{{ xs|join(', ') }}", vars),
            "x|2|3|ab|a, b");
  EXPECT_EQ(render("{{ 'ab'|upper }}{{ 'AB'|lower }}{{ 'ab cd'|capitalize }}{{ 'ab'|replace('a', 'x') }}"), "ABabAb cdxb");
  EXPECT_EQ(render("{{ x|default('d') }} {{ ''|default('d') }} {{ ''|default('d', true) }}"), "d  d");
  EXPECT_EQ(render("{{ '42'|int + 1 }} {{ 3.7|int }} {{ 5|string ~ 'x' }} {{ 'ab'|list }}"), "43 3 5x [\"a\", \"b\"]");
  EXPECT_EQ(render("{{ ms|selectattr('role', 'defined')|length }} {{ ms|rejectattr('c')|length }} {{ ms|map(attribute='role')|join }}",
                   vars),
            "2 1 usertool");
}

TEST(ChatTemplate, ToJson) {
  const json vars = {{"v", {{"a", {1, 2.5, true, nullptr}}, {"s", "q\"\n\xC3\xA9"}}}};
  EXPECT_EQ(render("{{ v|tojson }}", vars), "{\"a\": [1, 2.5, true, null], \"s\": \"q\\\"\\n\xC3\xA9\"}");
  EXPECT_EQ(render("{{ v.a|tojson(indent=2) }}", vars), "[\n  1,\n  2.5,\n  true,\n  null\n]");
  EXPECT_EQ(render("{{ v.s|tojson(ensure_ascii=true) }}", vars), "\"q\\\"\\n\\u00e9\"");
}

TEST(ChatTemplate, Tests) {
  const json vars = {{"s", "x"}, {"n", nullptr}, {"i", 3}, {"d", json::object()}, {"l", json::array()}};
  EXPECT_EQ(render("{{ s is string }}{{ n is none }}{{ i is number }}{{ i is integer }}{{ d is mapping }}{{ l is iterable }}", vars),
            "truetruetruetruetruetrue");
  EXPECT_EQ(render("{{ u is defined }}{{ u is undefined }}{{ s is not string }}{{ i is odd }}{{ false is false }}", vars),
            "falsetruefalsetruetrue");
}

TEST(ChatTemplate, UndefinedIsFalsyAndEmpty) {
  EXPECT_EQ(render("[{{ missing }}][{{ missing.attr }}][{{ missing['k'] }}]{% if missing %}x{% else %}falsy{% endif %}"),
            "[][][]falsy");
  EXPECT_EQ(render("{{ missing is defined }} {{ 'a' in missing }}"), "false false");
}

TEST(ChatTemplate, WhitespaceControl) {
  EXPECT_EQ(render("a  {{- 'b' -}}  c"), "abc");
  EXPECT_EQ(render("a\n  {%- if true -%}\n  b\n  {%- endif %}"), "ab");
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the indent before it.
  EXPECT_EQ(render("{% if true %}\n    x\n    {% endif %}\ny"), "    x\ny");
  EXPECT_EQ(render("{{ 'v' }}\nnext"), "v\nnext");  // not after an expression
  EXPECT_EQ(render("a {# comment #} b"), "a  b");
  EXPECT_EQ(render("a {#- comment -#} b"), "ab");
  EXPECT_EQ(render("line\n"), "line");  // one trailing newline is dropped
  EXPECT_EQ(render("x{% generation %}y{% endgeneration %}z"), "xyz");
}

TEST(ChatTemplate, RaiseException) {
  const std::string e = error_of("ok\n{{ raise_exception('Roles must alternate') }}");
  EXPECT_NE(e.find("chat template 't' line 2, column 4: raise_exception: Roles must alternate"), std::string::npos) << e;
}

TEST(ChatTemplate, ErrorsNameTemplateLineColumnAndWhat) {
  auto expect_error = [](const std::string& source, const std::string& part) {
    const std::string e = error_of(source);
    EXPECT_NE(e.find(part), std::string::npos) << "source: " << source << "\nerror: " << e;
  };
  expect_error("a\n{% include 'x' %}", "chat template 't' line 2, column 4: unsupported tag 'include'");
  expect_error("{{ x | wordwrap }}", "line 1, column 8: unsupported filter 'wordwrap'");
  expect_error("{{ 1 is divisibleby }}", "unsupported test 'divisibleby'");
  expect_error("{% if true %}open", "missing {% endif %} for the tag at line 1, column 1");
  expect_error("{% for x in [1] %}", "missing {% endfor %}");
  expect_error("{{ 'abc }}", "line 1, column 4: string literal is never closed");
  expect_error("{{ 1 + }}", "expected an expression");
  expect_error("{{ 'a' - 1 }}", "operator '-' is not supported between a string and a integer");
  expect_error("{{ none + 1 }}", "'+' on none");
  expect_error("{{ x.y() }}", "cannot call a undefined");
  expect_error("{{ '\\q' }}", "unsupported escape '\\q'");
  expect_error("{{ 1 }", "the template ends inside a tag");
  expect_error("{% set x.y = 1 %}", "can only assign attributes of a namespace()");
  expect_error("{{ 'a' | tojson(separators=(',', ':')) }}", "separators argument is not supported");
  // Found by fuzz_chat_template: an indent of millions of spaces took the memory before any limit spoke.
  expect_error("{{ [[1]] | tojson(indent=2000000) }}", "tojson: indent must be an integer from 0 to 100, got 2000000");
  expect_error("{{ [[1]] | tojson(indent=-1) }}", "got -1");
  expect_error("{{ range(1000000) | list | tojson(indent=100) }}", "JSON text grows past 64 MiB");
  expect_error("{{ " + std::string(1000, '(') + "1" + std::string(1000, ')') + " }}", "nesting deeper than 256 levels");
  expect_error("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "calls nested deeper than 100");
  // A namespace that holds itself (found by fuzz_chat_template: a stack overflow, then a leak).
  expect_error("{% set ns = namespace(n=0) %}{% set ns.n = ns %}", "holds the namespace itself");
  expect_error("{% set ns = namespace(n=0) %}{% set ns.n = [1, {'a': [ns]}] %}", "holds the namespace itself");
  expect_error("{% set ns = namespace(n=0, m=0) %}{% set o = namespace(x=ns) %}{% set ns.m = o %}",
               "holds the namespace itself");
  expect_error("{% set ns = namespace(x=0) %}{% for i in range(300) %}{% set ns.x = [ns.x] %}{% endfor %}{{ ns.x }}",
               "nested deeper than 256 levels");
  expect_error("{% for i in range(10000000) %}{% endfor %}", "range() of 10000000 items is not supported");
  expect_error("{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}",
               "the template's text grows past 64 MiB");
  expect_error("{% for i in range(3000) %}{% for j in range(3000) %}{% endfor %}{% endfor %}",
               "the template runs more than 4000000 steps");
}

TEST(ChatTemplate, ApplyPassesMessagesAndGenerationPrompt) {
  const auto t = ChatTemplate::from_string(
      "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}{% endfor %}{% if add_generation_prompt %}<assistant>{% endif %}",
      "t", {{"bos_token", "<s>"}});
  EXPECT_EQ(t.apply(Messages{{"user", "hi"}, {"assistant", "yo"}}, true), "<s><user>hi<assistant>yo<assistant>");
  EXPECT_EQ(t.apply(Messages{{"user", "hi"}}, false), "<s><user>hi");
  EXPECT_EQ(t.apply(json::array({{{"role", "user"}, {"content", "x"}}}), false, {{"bos_token", "[B]"}}), "[B]<user>x");
}

TEST(ChatTemplate, StrftimeNow) {
  const std::string year = render("{{ strftime_now('%Y') }}");
  ASSERT_EQ(year.size(), 4u);
  EXPECT_GE(std::stoi(year), 2024);
}

class ModelDir : public ::testing::Test {
 protected:
  void SetUp() override {
    dir = std::filesystem::temp_directory_path() / fmt::format("tp_chat_test_{}", ::getpid());
    std::filesystem::create_directories(dir);
  }
  void TearDown() override { std::filesystem::remove_all(dir); }
  void write(const std::string& name, const std::string& text) { std::ofstream(dir / name) << text; }
  std::filesystem::path dir;
};

TEST_F(ModelDir, ReadsTokenizerConfigTemplateAndSpecialTokens) {
  write("tokenizer_config.json", json{{"chat_template", "{{ bos_token }}|{{ eos_token }}|{{ pad_token }}"},
                                      {"bos_token", {{"__type", "AddedToken"}, {"content", "<B>"}}},
                                      {"eos_token", "<E>"},
                                      {"pad_token", nullptr}}
                                     .dump());
  EXPECT_EQ(ChatTemplate::from_model_dir(dir).apply(Messages{}, false), "<B>|<E>|");
}

TEST_F(ModelDir, PicksTheDefaultOfNamedTemplates) {
  write("tokenizer_config.json",
        json{{"chat_template", {{{"name", "tool_use"}, {"template", "tools"}}, {{"name", "default"}, {"template", "plain"}}}}}.dump());
  EXPECT_EQ(ChatTemplate::from_model_dir(dir).apply(Messages{}, false), "plain");
  write("tokenizer_config.json", json{{"chat_template", {{{"name", "tool_use"}, {"template", "tools"}}}}}.dump());
  try {
    ChatTemplate::from_model_dir(dir);
    FAIL() << "expected an error";
  } catch (const tp::Error& e) {
    EXPECT_NE(std::string(e.what()).find("none is named 'default'"), std::string::npos) << e.what();
  }
}

TEST_F(ModelDir, ChatTemplateJinjaFileWins) {
  write("tokenizer_config.json", json{{"chat_template", "from config"}, {"eos_token", "<E>"}}.dump());
  write("chat_template.jinja", "from file {{ eos_token }}\n");
  EXPECT_EQ(ChatTemplate::from_model_dir(dir).apply(Messages{}, false), "from file <E>");
}

TEST_F(ModelDir, NoTemplateNamesTheFolder) {
  write("tokenizer_config.json", json{{"eos_token", "<E>"}}.dump());
  try {
    ChatTemplate::from_model_dir(dir);
    FAIL() << "expected an error";
  } catch (const tp::Error& e) {
    EXPECT_NE(std::string(e.what()).find(dir.string() + " has no chat template"), std::string::npos) << e.what();
  }
}

}  // namespace
