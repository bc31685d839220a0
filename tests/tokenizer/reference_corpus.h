// The tokenizer test corpus (tests/tokenizer/data/corpus.jsonl, made by
// tools/tokenizer/make_corpus.py) joined with a JS reference encoder's ids
// for it (reference_ids.jsonl for Qwen3, llama3_reference_ids.jsonl for
// Llama 3; tools/tokenizer/reference_ids.mjs). Shared by the tests that
// compare against the reference; header-only, test code only (gtest).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "core/tokenizer/tokenizer.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace cortiq::tokenizer::test_corpus {

struct Case {
  int id = 0;
  std::string category;
  std::string input;  // bytes given to Encode (may be invalid UTF-8)
  std::vector<int32_t> ids;
  std::string nfc;
};

// env, when set, names a file replacing tests/tokenizer/data/<file>.
inline std::string DataPath(const char* env, const char* file) {
  const char* path = env != nullptr ? std::getenv(env) : nullptr;
  return path != nullptr ? std::string(path)
                         : std::string(CORTIQ_SOURCE_DIR "/tests/tokenizer/data/") + file;
}

inline std::string FromHex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

// The corpus with the reference's ids (reference_path) for each entry.
inline std::vector<Case> LoadCases(const std::string& corpus_path,
                                   const std::string& reference_path) {
  std::map<int, Case> cases;
  std::ifstream corpus(corpus_path);
  std::string line;
  while (std::getline(corpus, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    Case& c = cases[j.at("id").get<int>()];
    c.id = j.at("id").get<int>();
    c.category = j.at("category").get<std::string>();
    c.input = j.contains("hex") ? FromHex(j.at("hex").get<std::string>())
                                : j.at("text").get<std::string>();
  }
  std::ifstream reference(reference_path);
  while (std::getline(reference, line)) {
    if (line.empty()) continue;
    const auto j = nlohmann::json::parse(line);
    Case& c = cases[j.at("id").get<int>()];
    c.ids = j.at("ids").get<std::vector<int32_t>>();
    c.nfc = j.at("nfc").get<std::string>();
  }
  std::vector<Case> out;
  for (auto& [id, c] : cases) out.push_back(std::move(c));
  return out;
}

inline std::string IdsToString(const std::vector<int32_t>& ids) {
  std::ostringstream s;
  for (size_t i = 0; i < ids.size(); ++i) s << (i ? " " : "") << ids[i];
  return s.str();
}

// tok encodes every corpus string to the reference's ids; prints the tally
// under label.
inline void ExpectReferenceIds(const Tokenizer& tok, const std::vector<Case>& cases,
                               const std::string& label) {
  int agree = 0;
  for (const Case& c : cases) {
    const std::vector<int32_t> ids = tok.Encode(c.input);
    if (ids == c.ids) {
      ++agree;
    } else {
      ADD_FAILURE() << "corpus entry " << c.id << " (" << c.category << ") differs\n"
                    << "  ours:      " << IdsToString(ids) << "\n"
                    << "  reference: " << IdsToString(c.ids);
    }
  }
  std::cout << "[ reference ] " << label << " ids identical to the JS reference on " << agree << "/"
            << cases.size() << " corpus strings\n";
  EXPECT_EQ(agree, static_cast<int>(cases.size()));
}

inline std::string ReadFileOrEmpty(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream buffer;
  buffer << in.rdbuf();
  return buffer.str();
}

}  // namespace cortiq::tokenizer::test_corpus
