#include "core/model/script_checkpoint.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "core/model/forward_scratch.h"
#include "core/model/random_checkpoint.h"
#include "core/model/sequence_kv.h"
#include "core/model/transformer.h"
#include "core/tokenizer/tokenizer.h"
#include "core/util/status_macros.h"
#include "core/util/strings.h"
#include "nlohmann/json.hpp"

namespace cortiq::model {
namespace {

using util::Sv;

// Character classes a piece never straddles.
enum class CharClass { kWord, kNewline, kOther };

CharClass ClassOf(char c) {
  const auto u = static_cast<unsigned char>(c);
  if (u >= 0x80 || u == '_' || (u >= '0' && u <= '9') || (u >= 'a' && u <= 'z') ||
      (u >= 'A' && u <= 'Z')) {
    return CharClass::kWord;
  }
  return c == '\n' ? CharClass::kNewline : CharClass::kOther;
}

bool IsNameStart(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

// Length of the tag `</?[A-Za-z_][A-Za-z0-9_]*>` at the start of `s`, or 0.
size_t TagLength(std::string_view s) {
  size_t i = 1;
  if (s.empty() || s[0] != '<') return 0;
  if (i < s.size() && s[i] == '/') ++i;
  if (i >= s.size() || !IsNameStart(s[i])) return 0;
  while (i < s.size() && (IsNameStart(s[i]) || (s[i] >= '0' && s[i] <= '9'))) ++i;
  return i < s.size() && s[i] == '>' ? i + 1 : 0;
}

// Index of the first piece equal to `first` or to an earlier piece; npos when none.
size_t FirstRepeat(std::string_view first, const std::vector<std::string>& pieces) {
  std::set<std::string_view> seen{first};
  for (size_t i = 0; i < pieces.size(); ++i) {
    if (!seen.insert(pieces[i]).second) return i;
  }
  return std::string::npos;
}

// Joins pieces until none equals `first` or an earlier piece: a repeat
// takes the piece after it on (the last piece joins the one before it).
// Each join removes a piece, so this ends.
absl::Status JoinRepeats(std::string_view text, std::string_view first,
                         std::vector<std::string>* pieces) {
  for (size_t i; (i = FirstRepeat(first, *pieces)) != std::string::npos;) {
    if (i + 1 < pieces->size()) {
      (*pieces)[i] += (*pieces)[i + 1];
      pieces->erase(pieces->begin() + std::ptrdiff_t(i) + 1);
    } else if (i > 0) {
      (*pieces)[i - 1] += (*pieces)[i];
      pieces->pop_back();
    } else {
      return absl::InvalidArgumentError(
          absl::StrCat("text: '", Sv(text), "' is the prompt's last token itself"));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::string> ReadText(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat(path, ": cannot open"));
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat(path, ": read error"));
  return buffer.str();
}

// `base_json` with one non-special added token per entry of `added`
// (content -> id).
absl::StatusOr<std::string> WithAddedTokens(
    const std::string& base_json, const std::vector<std::pair<std::string, int32_t>>& added) {
  nlohmann::ordered_json root = nlohmann::ordered_json::parse(base_json, nullptr,
                                                              /*allow_exceptions=*/false);
  if (!root.is_object())
    return absl::InvalidArgumentError("base tokenizer.json: not a JSON object");
  for (const auto& [content, id] : added) {
    root["added_tokens"].push_back({{"id", id},
                                    {"content", content},
                                    {"single_word", false},
                                    {"lstrip", false},
                                    {"rstrip", false},
                                    {"normalized", false},
                                    {"special", false}});
  }
  return root.dump(2);
}

std::string IdList(const std::vector<int32_t>& ids) { return absl::StrJoin(ids, ","); }

// Greedy decoding of the written model from the chain's first token on must
// write the rest of the chain.
absl::Status CheckGreedy(const std::string& dir, const std::vector<int32_t>& prompt,
                         const std::vector<int32_t>& chain) {
  CORTIQ_ASSIGN_OR_RETURN(std::unique_ptr<Transformer> tf, Transformer::Load(dir));
  const ModelConfig& c = tf->config();
  SequenceKv kv(c, kv::KvMode::kF32);
  kv.Reserve(prompt.size() + chain.size());
  ForwardScratch scratch;
  std::vector<float> logits(size_t(c.vocab_size));
  CORTIQ_RETURN_IF_ERROR(tf->Prefill(prompt, kv, scratch, logits.data()));
  for (size_t step = 1; step < chain.size(); ++step) {
    const auto best = std::max_element(logits.begin(), logits.end()) - logits.begin();
    if (best != chain[step]) {
      return absl::InternalError(absl::StrCat(dir, ": greedy step ", step, " wrote id ", best,
                                              ", the script says ", chain[step]));
    }
    if (step + 1 == chain.size()) break;
    const int32_t next = chain[step];
    SequenceKv* seqs[1] = {&kv};
    CORTIQ_RETURN_IF_ERROR(
        tf->DecodeBatch(std::span<const int32_t>(&next, 1), seqs, scratch, logits.data()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<std::string>> CutScript(std::string_view text, std::string_view first) {
  std::vector<std::string> pieces;
  for (size_t i = 0; i < text.size();) {
    size_t n = TagLength(text.substr(i));
    if (n == 0) {
      const CharClass k = ClassOf(text[i]);
      n = 1;
      while (i + n < text.size() && ClassOf(text[i + n]) == k &&
             TagLength(text.substr(i + n)) == 0) {
        ++n;
      }
    }
    pieces.emplace_back(text.substr(i, n));
    i += n;
  }
  CORTIQ_RETURN_IF_ERROR(JoinRepeats(text, first, &pieces));
  return pieces;
}

absl::StatusOr<ScriptPlan> WriteScriptCheckpoint(const std::string& dir,
                                                 const ScriptCheckpointOptions& options) {
  if (options.text.empty() || options.text.size() > kMaxScriptBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("text: ", options.text.size(), " bytes; a script has 1 to ", kMaxScriptBytes));
  }
  std::string base_json;
  if (options.tokenizer_dir.empty()) {
    base_json = tokenizer::MakeByteLevelTokenizerJson();
  } else {
    CORTIQ_ASSIGN_OR_RETURN(base_json, ReadText(options.tokenizer_dir + "/tokenizer.json"));
  }
  CORTIQ_ASSIGN_OR_RETURN(tokenizer::Tokenizer base,
                          tokenizer::Tokenizer::FromJson(base_json, "base tokenizer.json"));
  const std::vector<int32_t> base_after = base.Encode(options.after);
  if (base_after.empty()) return absl::InvalidArgumentError("after: encodes to no tokens");

  std::optional<int32_t> end = base.im_end_id();
  if (!end) end = base.endoftext_id();
  if (!end) {
    return absl::InvalidArgumentError(
        "tokenizer: neither <|im_end|> nor <|endoftext|> to end the script with");
  }

  ScriptPlan plan;
  const std::string_view first = base.TokenBytes(base_after.back());
  CORTIQ_ASSIGN_OR_RETURN(plan.pieces, CutScript(options.text, first));
  std::string tokenizer_json;
  std::vector<int32_t> after, piece_ids;
  std::optional<tokenizer::Tokenizer> tok;
  // Added tokens match leftmost-longest, so a joined piece may swallow the
  // text at an earlier piece ("a, b" then ", b c" joined): the swallowed
  // piece takes its successor on and the cut is tried again (each round
  // removes a piece, so this ends).
  for (;;) {
    // Ids: a piece the base spells as one token keeps it; the others are added.
    std::vector<std::pair<std::string, int32_t>> added;
    piece_ids.clear();
    int32_t next_id = static_cast<int32_t>(base.vocab_size());
    for (const std::string& piece : plan.pieces) {
      const std::vector<int32_t> ids = base.Encode(piece);
      if (ids.size() == 1 && base.TokenBytes(ids[0]) == piece) {
        piece_ids.push_back(ids[0]);
      } else {
        added.emplace_back(piece, next_id);
        piece_ids.push_back(next_id++);
      }
    }
    plan.added_tokens = added.size();
    CORTIQ_ASSIGN_OR_RETURN(tokenizer_json, WithAddedTokens(base_json, added));
    CORTIQ_ASSIGN_OR_RETURN(
        tok, tokenizer::Tokenizer::FromJson(tokenizer_json, "script tokenizer.json"));
    after = tok->Encode(options.after);
    if (after != base_after) {
      return absl::InvalidArgumentError(
          absl::StrCat("after: encodes as ", IdList(after), " once the text's pieces [",
                       absl::StrJoin(plan.pieces, "|"), "] are tokens, not ", IdList(base_after)));
    }
    std::vector<int32_t> expected = after;
    expected.insert(expected.end(), piece_ids.begin(), piece_ids.end());
    const std::vector<int32_t> encoded = tok->Encode(options.after + options.text);
    if (encoded == expected) break;
    const size_t k = size_t(
        std::mismatch(encoded.begin(), encoded.end(), expected.begin(), expected.end()).first -
        encoded.begin());
    if (k < after.size() || k + 1 >= expected.size()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "text: the pieces [", absl::StrJoin(plan.pieces, "|"), "] encode back as ids ",
          IdList(encoded), ", not ", IdList(expected), " (after ", IdList(after), ")"));
    }
    const size_t swallowed = k - after.size();
    plan.pieces[swallowed] += plan.pieces[swallowed + 1];
    plan.pieces.erase(plan.pieces.begin() + std::ptrdiff_t(swallowed) + 1);
    CORTIQ_RETURN_IF_ERROR(JoinRepeats(options.text, first, &plan.pieces));
  }
  plan.ids = {after.back()};
  plan.ids.insert(plan.ids.end(), piece_ids.begin(), piece_ids.end());
  plan.ids.push_back(*end);
  std::map<int32_t, size_t> index;  // chain id -> its one-hot dimension
  for (int32_t id : plan.ids) {
    if (!index.emplace(id, index.size()).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("text: token ", id, " repeats in the chain ", IdList(plan.ids)));
    }
  }

  ModelConfig config = *NamedShape("tiny");
  config.vocab_size = static_cast<int64_t>(tok->vocab_size());
  config.hidden_size = std::max<int64_t>(64, (int64_t(index.size()) + 63) / 64 * 64);
  config.intermediate_size = 128;
  config.num_hidden_layers = 1;
  config.tie_word_embeddings = false;
  config.eos_token_ids = {*end};
  if (auto eot = tok->endoftext_id(); eot && *eot != *end) config.eos_token_ids.push_back(*eot);
  config.bos_token_id = tok->endoftext_id();
  const size_t h = size_t(config.hidden_size);

  RandomCheckpointOptions ro;
  ro.dtype = options.dtype;
  ro.seed = options.seed;
  ro.tokenizer_json = tokenizer_json;
  ro.edit = [&](std::string_view name, std::span<float> w) {
    if (name == "model.embed_tokens.weight") {  // [vocab × hidden]: chain tokens one-hot
      for (const auto& [id, dim] : index) {
        std::fill_n(w.begin() + std::ptrdiff_t(size_t(id) * h), h, 0.0f);
        w[size_t(id) * h + dim] = 1.0f;
      }
    } else if (name == "lm_head.weight") {  // [vocab × hidden]: row s(t) = one-hot of t
      std::fill(w.begin(), w.end(), 0.0f);
      for (size_t k = 0; k + 1 < plan.ids.size(); ++k) {
        w[size_t(plan.ids[k + 1]) * h + index.at(plan.ids[k])] = 1.0f;
      }
    } else if (name.ends_with("self_attn.o_proj.weight") ||
               name.ends_with("mlp.down_proj.weight")) {
      std::fill(w.begin(), w.end(), 0.0f);  // the residual stream stays the embedding
    }
  };
  CORTIQ_RETURN_IF_ERROR(WriteRandomCheckpoint(config, dir, ro));
  if (!options.tokenizer_dir.empty()) {
    const std::filesystem::path from =
        std::filesystem::path(options.tokenizer_dir) / "tokenizer_config.json";
    std::error_code ec;
    if (std::filesystem::exists(from, ec)) {
      std::filesystem::copy_file(from, std::filesystem::path(dir) / "tokenizer_config.json",
                                 std::filesystem::copy_options::overwrite_existing, ec);
      if (ec)
        return absl::InternalError(absl::StrCat(from.string(), ": copy failed: ", ec.message()));
    }
  }
  CORTIQ_RETURN_IF_ERROR(CheckGreedy(dir, after, plan.ids));
  return plan;
}

}  // namespace cortiq::model
