// Tokenizer loading, encoding and decoding on small hand-made tokenizer.json
// files (the byte-level writer plus edits), and every error path of the
// loader.

#include "core/tokenizer/tokenizer.h"

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "core/tokenizer/byte_level.h"
#include "core/tokenizer/unicode.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace cortiq::tokenizer {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using Json = nlohmann::ordered_json;
using Ids = std::vector<int32_t>;

Json ByteLevelJson() { return Json::parse(MakeByteLevelTokenizerJson()); }

Tokenizer MustLoad(const Json& json) {
  auto tok = Tokenizer::FromJson(json.dump(), "test.json");
  EXPECT_TRUE(tok.ok()) << tok.status();
  return *std::move(tok);
}

// Adds vocab entries (ByteLevel strings) with fresh ids after the current max.
void AddVocab(Json* json, const std::vector<std::string>& tokens) {
  int32_t next = 0;
  for (const auto& [key, value] : (*json)["model"]["vocab"].items()) {
    next = std::max(next, value.get<int32_t>() + 1);
  }
  for (const auto& t : (*json)["added_tokens"]) next = std::max(next, t["id"].get<int32_t>() + 1);
  for (const std::string& t : tokens) (*json)["model"]["vocab"][t] = next++;
}

std::string RandomUtf8(std::mt19937& rng, int max_chars) {
  static const std::vector<char32_t> kPool = {
      U'a',      U'Z',      U'0',      U' ',          U'\t',     U'\n',     U'\r',
      U'\'',     U'!',      U'\u00E9', U'\u0301',     U'\u0323', U'\u4E2D', U'\uAC00',
      U'\u1100', U'\u1161', U'\u11A8', U'\U0001F600', U'\u200D', U'\u00A0', U'\uFEFF',
      U'\u0085', U'\u212B', U'<',      U'|',          U'>'};
  std::string s;
  const int n = static_cast<int>(rng() % (max_chars + 1));
  for (int i = 0; i < n; ++i) {
    if (rng() % 4 == 0) {
      AppendUtf8(static_cast<char32_t>(rng() % 0xD800), &s);  // any BMP scalar below surrogates
    } else {
      AppendUtf8(kPool[rng() % kPool.size()], &s);
    }
  }
  return s;
}

// ---- byte-level writer ------------------------------------------------------

TEST(ByteLevelTokenizerTest, LayoutAndSpecialTokens) {
  const Tokenizer tok = MustLoad(ByteLevelJson());
  EXPECT_EQ(tok.vocab_size(), 259u);
  EXPECT_EQ(tok.endoftext_id(), 256);
  EXPECT_EQ(tok.im_start_id(), 257);
  EXPECT_EQ(tok.im_end_id(), 258);
  for (int b = 0; b < 256; ++b) {
    EXPECT_EQ(tok.TokenString(b), ByteLevelUtf8Of(static_cast<uint8_t>(b)));
    EXPECT_EQ(tok.TokenBytes(b), std::string(1, static_cast<char>(b)));
    EXPECT_FALSE(tok.IsSpecial(b));
  }
  EXPECT_EQ(tok.TokenString(32), "\u0120");  // 'Ġ'
  EXPECT_EQ(tok.TokenString(10), "\u010A");  // 'Ċ'
  EXPECT_EQ(tok.TokenString(258), "<|im_end|>");
  EXPECT_TRUE(tok.IsSpecial(258));
  EXPECT_EQ(tok.Encode("abc"), (Ids{97, 98, 99}));
  EXPECT_EQ(tok.Encode("<|im_start|>hi<|im_end|>"), (Ids{257, 104, 105, 258}));
  EXPECT_EQ(tok.Encode("\u00E9"), (Ids{0xC3, 0xA9}));
  EXPECT_EQ(tok.Encode("e\u0301"), (Ids{0xC3, 0xA9}));  // NFC first
  EXPECT_EQ(tok.Decode(Ids{257, 104, 105, 258}), "<|im_start|>hi<|im_end|>");
}

TEST(ByteLevelTokenizerTest, CustomSpecialTokens) {
  const Tokenizer tok = MustLoad(Json::parse(MakeByteLevelTokenizerJson({"<s>", "</s>", "<pad>"})));
  EXPECT_EQ(tok.vocab_size(), 259u);
  EXPECT_EQ(tok.TokenId("</s>"), 257);
  EXPECT_FALSE(tok.endoftext_id().has_value());
  EXPECT_EQ(tok.Encode("<s>x</s>"), (Ids{256, 'x', 257}));
  const Tokenizer none = MustLoad(Json::parse(MakeByteLevelTokenizerJson({})));
  EXPECT_EQ(none.vocab_size(), 256u);
}

TEST(ByteLevelTokenizerTest, RoundTripsAnyText) {
  const Tokenizer tok = MustLoad(ByteLevelJson());
  std::mt19937 rng(42);
  for (int trial = 0; trial < 3000; ++trial) {
    const std::string s = RandomUtf8(rng, 40);
    const Ids ids = tok.Encode(s, /*parse_special=*/false);
    EXPECT_EQ(tok.Decode(ids), ToNfc(s));
    for (int32_t id : ids) ASSERT_LT(id, 256);
  }
  // Every byte value, including invalid UTF-8: repaired to U+FFFD first.
  for (int b = 0; b < 256; ++b) {
    const std::string s(1, static_cast<char>(b));
    EXPECT_EQ(tok.Decode(tok.Encode(s)), SanitizeUtf8(s)) << b;
  }
}

TEST(ByteLevelTokenizerTest, InvalidUtf8IsReplacedNotPassedThrough) {
  const Tokenizer tok = MustLoad(ByteLevelJson());
  EXPECT_EQ(tok.Encode("a\xFF"
                       "b"),
            (Ids{'a', 0xEF, 0xBF, 0xBD, 'b'}));
  EXPECT_EQ(tok.Encode("\xE2\x82"), (Ids{0xEF, 0xBF, 0xBD}));
  std::mt19937 rng(5);
  for (int trial = 0; trial < 2000; ++trial) {
    std::string s;
    const int n = rng() % 12;
    for (int i = 0; i < n; ++i) s.push_back(static_cast<char>(rng() % 256));
    EXPECT_EQ(tok.Decode(tok.Encode(s)), ToNfc(SanitizeUtf8(s)));
  }
}

TEST(ByteLevelTokenizerTest, DecodeRepairsCutSequencesAndSkipsUnknownIds) {
  const Tokenizer tok = MustLoad(ByteLevelJson());
  EXPECT_EQ(tok.Decode(Ids{0xC3}), "\uFFFD");
  EXPECT_EQ(tok.Decode(Ids{0xC3, 258}), "\uFFFD<|im_end|>");
  EXPECT_EQ(tok.Decode(Ids{'a', -1, 100000, 259, 'b'}), "ab");
  EXPECT_EQ(tok.TokenString(-1), "");
  EXPECT_EQ(tok.TokenString(1 << 30), "");
  EXPECT_EQ(tok.TokenBytes(259), "");
  EXPECT_FALSE(tok.IsSpecial(-5));
  EXPECT_FALSE(tok.TokenId("nope").has_value());
}

// ---- added tokens -------------------------------------------------------------

Json WithAddedTokens(const std::vector<Json>& tokens) {
  Json json = ByteLevelJson();
  for (const Json& t : tokens) json["added_tokens"].push_back(t);
  return json;
}

Json Added(int id, const std::string& content, bool special, bool lstrip = false,
           bool rstrip = false) {
  return Json{{"id", id},         {"content", content},  {"single_word", false}, {"lstrip", lstrip},
              {"rstrip", rstrip}, {"normalized", false}, {"special", special}};
}

TEST(AddedTokensTest, LeftmostThenLongestMatchWins) {
  const Tokenizer tok = MustLoad(WithAddedTokens(
      {Added(300, "<a>", true), Added(301, "<a><b>", true), Added(302, "b>", true)}));
  EXPECT_EQ(tok.Encode("<a><b>"), (Ids{301}));
  EXPECT_EQ(tok.Encode("<a><c>"), (Ids{300, '<', 'c', '>'}));
  EXPECT_EQ(tok.Encode("x<a>b>"), (Ids{'x', 300, 302}));
  EXPECT_EQ(tok.Encode("<<a>"), (Ids{'<', 300}));
}

TEST(AddedTokensTest, ParseSpecialOnlyAffectsSpecialTokens) {
  const Tokenizer tok = MustLoad(WithAddedTokens({Added(300, "<think>", false)}));
  EXPECT_EQ(tok.Encode("<|im_end|><think>", /*parse_special=*/false),
            (Ids{'<', '|', 'i', 'm', '_', 'e', 'n', 'd', '|', '>', 300}));
  EXPECT_EQ(tok.Encode("<|im_end|><think>"), (Ids{258, 300}));
  EXPECT_FALSE(tok.IsSpecial(300));
  EXPECT_TRUE(tok.IsAddedToken(300));
}

TEST(AddedTokensTest, LstripAndRstripTrimNeighbouringWhitespace) {
  const Tokenizer tok =
      MustLoad(WithAddedTokens({Added(300, "<mask>", true, /*lstrip=*/true, /*rstrip=*/true)}));
  EXPECT_EQ(tok.Encode("a \t<mask>\n b"), (Ids{'a', 300, 'b'}));
  EXPECT_EQ(tok.Encode("a<mask>b"), (Ids{'a', 300, 'b'}));
}

TEST(AddedTokensTest, NormalizationIsPerSection) {
  const Tokenizer tok = MustLoad(ByteLevelJson());
  // The combining accent after the special token stays a lone mark.
  EXPECT_EQ(tok.Decode(tok.Encode("e<|im_end|>\u0301")), "e<|im_end|>\u0301");
  EXPECT_EQ(tok.Decode(tok.Encode("e\u0301<|im_end|>")), "\u00E9<|im_end|>");
}

// ---- BPE merges -----------------------------------------------------------------

TEST(BpeTest, MergesApplyByRank) {
  Json json = ByteLevelJson();
  AddVocab(&json, {"ab", "bc", "abc"});
  json["model"]["merges"] = Json::array({"b c", "a b", "a bc"});
  Tokenizer tok = MustLoad(json);
  const int32_t ab = *tok.TokenId("ab"), bc = *tok.TokenId("bc"), abc = *tok.TokenId("abc");
  EXPECT_EQ(tok.Encode("abc"), (Ids{abc}));  // b c (rank 0), then a bc
  EXPECT_EQ(tok.Encode("ab"), (Ids{ab}));
  EXPECT_EQ(tok.Encode("abab"), (Ids{ab, ab}));
  EXPECT_EQ(tok.Decode(tok.Encode("abcab")), "abcab");

  // Same merges as [left, right] pairs, in another order: a b first.
  json["model"]["merges"] = Json::array({Json::array({"a", "b"}), Json::array({"b", "c"})});
  tok = MustLoad(json);
  EXPECT_EQ(tok.Encode("abc"), (Ids{ab, 'c'}));
  EXPECT_EQ(tok.Encode("bc"), (Ids{bc}));
}

TEST(BpeTest, TiesGoToTheLeftmostPair) {
  Json json = ByteLevelJson();
  AddVocab(&json, {"aa", "aaaa"});
  json["model"]["merges"] = Json::array({"a a", "aa aa"});
  const Tokenizer tok = MustLoad(json);
  const int32_t aa = *tok.TokenId("aa"), aaaa = *tok.TokenId("aaaa");
  EXPECT_EQ(tok.Encode("aaa"), (Ids{aa, 'a'}));
  EXPECT_EQ(tok.Encode("aaaaa"), (Ids{aaaa, 'a'}));
  EXPECT_EQ(tok.Encode("aaaaaa"), (Ids{aaaa, aa}));
  // A long word (past the word cache) takes the same path.
  const Ids long_ids = tok.Encode(std::string(41, 'a'));
  EXPECT_EQ(long_ids.size(), 11u);
  EXPECT_EQ(long_ids.back(), 'a');
}

TEST(BpeTest, MergesSeeByteLevelStrings) {
  // " the" is "Ġthe" in ByteLevel form; merges are written that way.
  Json json = ByteLevelJson();
  AddVocab(&json, {"\u0120t", "he", "\u0120the"});
  json["model"]["merges"] = Json::array({"h e", "\u0120 t", "\u0120t he"});
  const Tokenizer tok = MustLoad(json);
  EXPECT_EQ(tok.Encode(" the the"), (Ids{*tok.TokenId("\u0120the"), *tok.TokenId("\u0120the")}));
  EXPECT_EQ(tok.Encode("the"), (Ids{'t', *tok.TokenId("he")}));
}

TEST(BpeTest, IgnoreMergesTakesWholeWordsFromTheVocab) {
  Json json = ByteLevelJson();
  AddVocab(&json, {"ab", "abc"});
  json["model"]["merges"] = Json::array({"a b"});  // "abc" itself is unreachable by merges
  EXPECT_EQ(MustLoad(json).Encode("abc"), (Ids{*MustLoad(json).TokenId("ab"), 'c'}));
  json["model"]["ignore_merges"] = true;
  const Tokenizer tok = MustLoad(json);
  EXPECT_EQ(tok.Encode("abc"), (Ids{*tok.TokenId("abc")}));
}

TEST(BpeTest, Gpt2ByteLevelPreTokenizer) {
  Json json = ByteLevelJson();
  json["pre_tokenizer"] = {{"type", "ByteLevel"},
                           {"add_prefix_space", false},
                           {"trim_offsets", true},
                           {"use_regex", true}};
  json["normalizer"] = nullptr;
  AddVocab(&json, {"12"});
  json["model"]["merges"] = Json::array({"1 2"});
  const Tokenizer tok = MustLoad(json);
  // GPT-2 keeps digit runs together (Qwen splits them one by one).
  EXPECT_EQ(tok.Encode("1212"), (Ids{*tok.TokenId("12"), *tok.TokenId("12")}));
  // No normalizer: decomposed text stays decomposed.
  EXPECT_EQ(tok.Decode(tok.Encode("e\u0301")), "e\u0301");
}

// ---- semantics of the object ------------------------------------------------------

TEST(TokenizerTest, CopiesShareAndMovesKeepWorking) {
  Tokenizer a = MustLoad(ByteLevelJson());
  const Tokenizer b = a;  // cheap: shares the tables
  Tokenizer c = std::move(a);
  EXPECT_EQ(b.Encode("hi"), c.Encode("hi"));
  a = c;
  EXPECT_EQ(a.Encode("hi"), (Ids{'h', 'i'}));
}

TEST(TokenizerTest, ConcurrentEncodeIsConsistent) {
  Json json = ByteLevelJson();
  AddVocab(&json, {"th", "the", "\u0120the", "\u0120t", "in", "ing"});
  json["model"]["merges"] = Json::array({"t h", "th e", "\u0120 t", "\u0120t he", "i n", "in g"});
  json["model"]["vocab"]["he"] = 400;
  const Tokenizer tok = MustLoad(json);
  std::vector<std::string> texts;
  std::mt19937 rng(9);
  for (int i = 0; i < 64; ++i) {
    texts.push_back("the thing " + RandomUtf8(rng, 20) + " the singing thing");
  }
  std::vector<Ids> expected;
  for (const auto& t : texts) expected.push_back(tok.Encode(t));
  std::vector<std::thread> threads;
  std::vector<int> failures(4, 0);
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int round = 0; round < 50; ++round) {
        for (size_t i = 0; i < texts.size(); ++i) {
          if (tok.Encode(texts[(i + t) % texts.size()]) != expected[(i + t) % texts.size()]) {
            ++failures[t];
          }
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  for (int f : failures) EXPECT_EQ(f, 0);
}

// ---- loader errors ------------------------------------------------------------------

absl::Status LoadError(const std::string& text) {
  auto tok = Tokenizer::FromJson(text, "bad.json");
  EXPECT_FALSE(tok.ok());
  return tok.ok() ? absl::OkStatus() : tok.status();
}

absl::Status LoadJsonError(const Json& json) { return LoadError(json.dump()); }

TEST(TokenizerErrorsTest, MissingFileNamesThePath) {
  auto tok = Tokenizer::FromFile("/nonexistent/dir/tokenizer.json");
  ASSERT_FALSE(tok.ok());
  EXPECT_EQ(tok.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(std::string(tok.status().message()), HasSubstr("/nonexistent/dir/tokenizer.json"));
}

TEST(TokenizerErrorsTest, FromFileReadsAndNamesTheFileInErrors) {
  const std::string dir = CORTIQ_BINARY_DIR "/tokenizer_test_tmp";
  std::filesystem::create_directories(dir);
  const std::string good = dir + "/good.json", bad = dir + "/bad.json";
  std::ofstream(good) << MakeByteLevelTokenizerJson();
  std::ofstream(bad) << "{\"model\": 1}";
  auto tok = Tokenizer::FromFile(good);
  ASSERT_TRUE(tok.ok()) << tok.status();
  EXPECT_EQ(tok->Encode("x"), (Ids{'x'}));
  auto err = Tokenizer::FromFile(bad);
  ASSERT_FALSE(err.ok());
  EXPECT_THAT(std::string(err.status().message()), HasSubstr(bad));
  EXPECT_THAT(std::string(err.status().message()), HasSubstr("model"));
}

TEST(TokenizerErrorsTest, MalformedJson) {
  for (const std::string text :
       {"", "{", "{\"model\": ", "[1, 2", "nul", "{\"a\": tru}", "\xFF\xFE"}) {
    const absl::Status s = LoadError(text);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(s.message()), HasSubstr("bad.json: malformed JSON")) << text;
  }
  EXPECT_THAT(std::string(LoadError(std::string(100000, '[')).message()), HasSubstr("nested"));
  EXPECT_THAT(std::string(LoadError(std::string("[1, 2]")).message()), HasSubstr("top level"));
}

struct FieldCase {
  const char* name;
  std::function<void(Json*)> edit;
  const char* expected;  // substring of the message
};

TEST(TokenizerErrorsTest, UnsupportedOrInvalidFieldsAreNamed) {
  const std::vector<FieldCase> cases = {
      {"no model", [](Json* j) { j->erase("model"); }, "model: expected an object"},
      {"model type", [](Json* j) { (*j)["model"]["type"] = "WordPiece"; }, "model.type"},
      {"model type kind", [](Json* j) { (*j)["model"]["type"] = 3; },
       "model.type: expected a string"},
      {"vocab", [](Json* j) { (*j)["model"]["vocab"] = Json::array(); }, "model.vocab"},
      {"vocab id string", [](Json* j) { (*j)["model"]["vocab"]["!"] = "0"; }, "model.vocab[\"!\"]"},
      {"vocab id negative", [](Json* j) { (*j)["model"]["vocab"]["!"] = -1; }, "out of range"},
      {"vocab id huge", [](Json* j) { (*j)["model"]["vocab"]["!"] = 1LL << 40; }, "out of range"},
      {"vocab id float", [](Json* j) { (*j)["model"]["vocab"]["!"] = 1.5; }, "integer id"},
      {"duplicate id", [](Json* j) { (*j)["model"]["vocab"]["xyz"] = 5; }, "id 5 is used by"},
      {"byte missing", [](Json* j) { (*j)["model"]["vocab"].erase("\u0120"); },
       "lacks the ByteLevel token"},
      {"merges type", [](Json* j) { (*j)["model"]["merges"] = "a b"; }, "model.merges"},
      {"merge no space", [](Json* j) { (*j)["model"]["merges"] = Json::array({"ab"}); },
       "model.merges[0]"},
      {"merge two spaces", [](Json* j) { (*j)["model"]["merges"] = Json::array({"a b c"}); },
       "model.merges[0]"},
      {"merge bad pair",
       [](Json* j) { (*j)["model"]["merges"] = Json::array({Json::array({"a"})}); },
       "model.merges[0]"},
      {"merge unknown", [](Json* j) { (*j)["model"]["merges"] = Json::array({"a b"}); },
       "token \"ab\" is not in model.vocab"},
      {"dropout", [](Json* j) { (*j)["model"]["dropout"] = 0.1; }, "model.dropout"},
      {"suffix", [](Json* j) { (*j)["model"]["end_of_word_suffix"] = "</w>"; },
       "model.end_of_word_suffix"},
      {"prefix", [](Json* j) { (*j)["model"]["continuing_subword_prefix"] = "##"; },
       "model.continuing_subword_prefix"},
      {"byte_fallback", [](Json* j) { (*j)["model"]["byte_fallback"] = true; },
       "model.byte_fallback"},
      {"ignore_merges type", [](Json* j) { (*j)["model"]["ignore_merges"] = "yes"; },
       "model.ignore_merges: expected a boolean"},
      {"unk", [](Json* j) { (*j)["model"]["unk_token"] = "<unk>"; }, "model.unk_token"},
      {"normalizer",
       [](Json* j) {
         (*j)["normalizer"] = {{"type", "NFKC"}};
       },
       "normalizer.type"},
      {"normalizer seq",
       [](Json* j) {
         (*j)["normalizer"] = {{"type", "Sequence"},
                               {"normalizers", Json::array({{{"type", "Lowercase"}}})}};
       },
       "normalizer.normalizers[0].type"},
      {"no pre_tokenizer", [](Json* j) { (*j)["pre_tokenizer"] = nullptr; }, "pre_tokenizer"},
      {"pre_tokenizer type",
       [](Json* j) {
         (*j)["pre_tokenizer"] = {{"type", "Whitespace"}};
       },
       "pre_tokenizer.type"},
      {"split regex",
       [](Json* j) { (*j)["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\s+"; },
       "pre_tokenizer.pretokenizers[0].pattern.Regex"},
      {"split string",
       [](Json* j) {
         (*j)["pre_tokenizer"]["pretokenizers"][0]["pattern"] = {{"String", " "}};
       },
       "pre_tokenizer.pretokenizers[0].pattern"},
      {"split behavior",
       [](Json* j) { (*j)["pre_tokenizer"]["pretokenizers"][0]["behavior"] = "Removed"; },
       "pre_tokenizer.pretokenizers[0].behavior"},
      {"split invert", [](Json* j) { (*j)["pre_tokenizer"]["pretokenizers"][0]["invert"] = true; },
       "pre_tokenizer.pretokenizers[0].invert"},
      {"byte level regex",
       [](Json* j) { (*j)["pre_tokenizer"]["pretokenizers"][1]["use_regex"] = true; },
       "pre_tokenizer.pretokenizers[1].use_regex"},
      {"prefix space",
       [](Json* j) { (*j)["pre_tokenizer"]["pretokenizers"][1]["add_prefix_space"] = true; },
       "pre_tokenizer.pretokenizers[1].add_prefix_space"},
      {"sequence length", [](Json* j) { (*j)["pre_tokenizer"]["pretokenizers"].erase(1); },
       "pre_tokenizer.pretokenizers"},
      {"decoder",
       [](Json* j) {
         (*j)["decoder"] = {{"type", "WordPiece"}};
       },
       "decoder.type"},
      {"no decoder", [](Json* j) { j->erase("decoder"); }, "decoder: missing"},
      {"post",
       [](Json* j) {
         (*j)["post_processor"] = {{"type", "TemplateProcessing"}};
       },
       "post_processor.type"},
      {"truncation",
       [](Json* j) {
         (*j)["truncation"] = {{"max_length", 5}};
       },
       "truncation"},
      {"added type", [](Json* j) { (*j)["added_tokens"] = Json::object(); }, "added_tokens"},
      {"added entry", [](Json* j) { (*j)["added_tokens"][0] = 5; }, "added_tokens[0]"},
      {"added empty", [](Json* j) { (*j)["added_tokens"][1]["content"] = ""; },
       "added_tokens[1].content"},
      {"added no id", [](Json* j) { (*j)["added_tokens"][2].erase("id"); }, "added_tokens[2].id"},
      {"added special", [](Json* j) { (*j)["added_tokens"][0]["special"] = "yes"; },
       "added_tokens[0].special"},
      {"single word", [](Json* j) { (*j)["added_tokens"][0]["single_word"] = true; },
       "added_tokens[0].single_word"},
  };
  for (const FieldCase& c : cases) {
    Json json = ByteLevelJson();
    c.edit(&json);
    const absl::Status s = LoadJsonError(json);
    EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << c.name;
    EXPECT_THAT(std::string(s.message()), HasSubstr("bad.json: ")) << c.name;
    EXPECT_THAT(std::string(s.message()), HasSubstr(c.expected)) << c.name << ": " << s;
  }
}

TEST(TokenizerErrorsTest, MutatedFilesNeverCrash) {
  // Truncations and byte flips of a valid file either load or fail cleanly.
  Json json = ByteLevelJson();
  AddVocab(&json, {"ab"});
  json["model"]["merges"] = Json::array({"a b"});
  const std::string good = json.dump();
  std::mt19937 rng(123);
  int loaded = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::string text = good;
    if (trial % 2 == 0) {
      text.resize(rng() % text.size());
    } else {
      for (int k = 0; k < 3; ++k) text[rng() % text.size()] = static_cast<char>(rng() % 256);
    }
    auto tok = Tokenizer::FromJson(text, "mutant.json");
    if (tok.ok()) {
      ++loaded;
      (void)tok->Encode("ab <|im_end|> x");
    }
  }
  SUCCEED() << loaded << " mutants still loaded";
}

}  // namespace
}  // namespace cortiq::tokenizer
