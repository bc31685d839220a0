// Tests of the O(1)-attention configuration (core/kv/o1_config.h): every
// layer-spec form, malformed specs as clear errors, the environment reader,
// the config.json hint and the field-wise precedence
// request > flag > env > hint > default.
#include "core/kv/o1_config.h"

#include <map>
#include <string>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "nlohmann/json.hpp"

namespace cortiq::kv {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

std::vector<size_t> Layers(std::string_view spec, size_t n) {
  absl::StatusOr<std::vector<size_t>> r = ParseLayerSpec(spec, n);
  EXPECT_TRUE(r.ok()) << spec << ": " << r.status();
  return r.ok() ? *r : std::vector<size_t>{};
}

TEST(O1LayerSpecTest, EveryForm) {
  EXPECT_THAT(Layers("all", 4), ElementsAre(0, 1, 2, 3));
  EXPECT_THAT(Layers(" ALL ", 2), ElementsAre(0, 1));
  EXPECT_THAT(Layers("deep2", 5), ElementsAre(3, 4));
  EXPECT_THAT(Layers("deep5", 5), ElementsAre(0, 1, 2, 3, 4));
  EXPECT_THAT(Layers("Deep1", 28), ElementsAre(27));
  EXPECT_THAT(Layers("3,1,2", 4), ElementsAre(1, 2, 3));
  EXPECT_THAT(Layers(" 7 , 0 ", 8), ElementsAre(0, 7));
  EXPECT_THAT(Layers("2,2,1", 4), ElementsAre(1, 2));
  EXPECT_THAT(Layers("5", 6), ElementsAre(5));
  EXPECT_THAT(Layers("0,0", 3), ElementsAre(0));  // layer 0 alone ("0" is off)
  for (const char* off : {"off", "OFF", "none", "0", " off "}) {
    EXPECT_THAT(Layers(off, 28), IsEmpty()) << off;
  }
  EXPECT_THAT(Layers("all", 0), IsEmpty());
}

TEST(O1LayerSpecTest, MalformedSpecsAreClearErrors) {
  for (const char* bad : {"deep", "deep0", "deep-1", "deepx", "deep 2", "1,,2", ",1", "1,", "x",
                          "-1", "+1", "1.5", "all,1", "", "  ", "1;2", "99999999999999999999999"}) {
    absl::StatusOr<std::vector<size_t>> r = ParseLayerSpec(bad, 28);
    ASSERT_FALSE(r.ok()) << "'" << bad << "' parsed";
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(r.status().message()), HasSubstr(std::string("'") + bad + "'"));
  }
  EXPECT_THAT(std::string(ParseLayerSpec("deep0", 28).status().message()), HasSubstr("off"));
}

TEST(O1LayerSpecTest, OutOfRangeIsAnError) {
  absl::StatusOr<std::vector<size_t>> r = ParseLayerSpec("1,28", 28);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("layer 28 is out of range"));
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("'1,28'"));
  r = ParseLayerSpec("deep29", 28);
  ASSERT_FALSE(r.ok());
  EXPECT_THAT(std::string(r.status().message()), HasSubstr("only 28 layers"));
}

TEST(O1RectTest, Parse) {
  EXPECT_EQ(*ParseO1Rect("agg"), O1Rect::kAggregate);
  EXPECT_EQ(*ParseO1Rect("aggregate"), O1Rect::kAggregate);
  EXPECT_EQ(*ParseO1Rect(" FM "), O1Rect::kFm);
  EXPECT_FALSE(ParseO1Rect("fmm").ok());
  EXPECT_FALSE(ParseO1Rect("").ok());
  EXPECT_THAT(std::string(ParseO1Rect("clamp").status().message()), HasSubstr("'clamp'"));
}

// A fake environment for EnvOverrides.
using EnvMap = std::map<std::string, std::string>;
class FakeEnv {
 public:
  explicit FakeEnv(EnvMap vars) : vars_(std::move(vars)) {}
  absl::StatusOr<O1Overrides> Read() const {
    return EnvOverrides([this](const char* name) -> const char* {
      auto it = vars_.find(name);
      return it == vars_.end() ? nullptr : it->second.c_str();
    });
  }

 private:
  EnvMap vars_;
};

TEST(O1EnvTest, UnsetIsEmpty) {
  absl::StatusOr<O1Overrides> o = FakeEnv({}).Read();
  ASSERT_TRUE(o.ok());
  EXPECT_FALSE(o->layers || o->m || o->w || o->sink || o->rect);
}

TEST(O1EnvTest, ReadsEveryVariable) {
  absl::StatusOr<O1Overrides> o = FakeEnv({{"CMF_O1", "deep8"},
                                           {"CMF_O1_M", "16"},
                                           {"CMF_O1_WINDOW", " 256 "},
                                           {"CMF_O1_SINK", "0"},
                                           {"CMF_O1_RECT", "fm"}})
                                      .Read();
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(*o->layers, "deep8");
  EXPECT_EQ(*o->m, 16u);
  EXPECT_EQ(*o->w, 256u);
  EXPECT_EQ(*o->sink, 0u);
  EXPECT_EQ(*o->rect, O1Rect::kFm);
}

TEST(O1EnvTest, SetButEmptyMeansOff) {
  absl::StatusOr<O1Overrides> o = FakeEnv(EnvMap{{"CMF_O1", ""}}).Read();
  ASSERT_TRUE(o.ok());
  EXPECT_EQ(*o->layers, "off");
}

TEST(O1EnvTest, MalformedValuesNameTheVariable) {
  struct Case {
    const char* var;
    const char* value;
  };
  for (Case c : {Case{"CMF_O1", "deep"}, Case{"CMF_O1", "1,,2"}, Case{"CMF_O1_M", "many"},
                 Case{"CMF_O1_M", "-4"}, Case{"CMF_O1_WINDOW", "1e3"}, Case{"CMF_O1_SINK", ""},
                 Case{"CMF_O1_RECT", "softmax"}}) {
    absl::StatusOr<O1Overrides> o = FakeEnv(EnvMap{{c.var, c.value}}).Read();
    ASSERT_FALSE(o.ok()) << c.var << "=" << c.value;
    EXPECT_EQ(o.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_THAT(std::string(o.status().message()), HasSubstr(c.var));
  }
}

TEST(O1HintTest, ReadsTheModelConfig) {
  auto cfg = nlohmann::json::parse(R"({"num_hidden_layers": 28,
      "o1_attn": {"layers": "deep4", "m": 16, "w": 64, "sink": 2}})");
  absl::StatusOr<O1Overrides> o = O1HintFromModelConfig(cfg);
  ASSERT_TRUE(o.ok()) << o.status();
  EXPECT_EQ(*o->layers, "deep4");
  EXPECT_EQ(*o->m, 16u);
  EXPECT_EQ(*o->w, 64u);
  EXPECT_EQ(*o->sink, 2u);
  EXPECT_FALSE(o->rect);

  o = O1HintFromModelConfig(nlohmann::json::parse(R"({"o1_attn": {"layers": [5, 1, 3]}})"));
  ASSERT_TRUE(o.ok());
  EXPECT_THAT(Layers(*o->layers, 8), ElementsAre(1, 3, 5));
  o = O1HintFromModelConfig(nlohmann::json::parse(R"({"o1_attn": {"layers": [0]}})"));
  ASSERT_TRUE(o.ok());
  EXPECT_THAT(Layers(*o->layers, 8), ElementsAre(0));  // not the "0" = off keyword
}

TEST(O1HintTest, AbsentHintIsEmptyAndRectIsIgnored) {
  absl::StatusOr<O1Overrides> o = O1HintFromModelConfig(nlohmann::json::parse(R"({"x": 1})"));
  ASSERT_TRUE(o.ok());
  EXPECT_FALSE(o->layers || o->m || o->w || o->sink || o->rect);
  o = O1HintFromModelConfig(
      nlohmann::json::parse(R"({"o1_attn": {"layers": "all", "rect": "fm"}})"));
  ASSERT_TRUE(o.ok());
  EXPECT_FALSE(o->rect);
}

TEST(O1HintTest, MalformedHintsAreErrors) {
  for (const char* bad : {R"({"o1_attn": "all"})", R"({"o1_attn": {"layers": "deep0"}})",
                          R"({"o1_attn": {"layers": []}})", R"({"o1_attn": {"layers": [1, -2]}})",
                          R"({"o1_attn": {"layers": ["1"]}})", R"({"o1_attn": {"layers": 3}})",
                          R"({"o1_attn": {"layers": "all", "m": "32"}})",
                          R"({"o1_attn": {"layers": "all", "w": -1}})",
                          R"({"o1_attn": {"layers": "all", "sink": 1.5}})"}) {
    absl::StatusOr<O1Overrides> o = O1HintFromModelConfig(nlohmann::json::parse(bad));
    ASSERT_FALSE(o.ok()) << bad;
    EXPECT_THAT(std::string(o.status().message()), HasSubstr("o1_attn")) << bad;
  }
}

TEST(O1ResolveTest, DefaultsAndDisabledWithoutASpec) {
  absl::StatusOr<O1Config> c = ResolveO1Config({}, {}, {}, {}, 28);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->Enabled());
  EXPECT_EQ(c->m, 32u);
  EXPECT_EQ(c->w, 128u);
  EXPECT_EQ(c->sink, 4u);
  EXPECT_EQ(c->rect, O1Rect::kAggregate);
  EXPECT_EQ(c->DebugString(), "o1: off");
  // Parameters without a layer spec change nothing that matters.
  O1Overrides env;
  env.m = 8;
  c = ResolveO1Config({}, {}, env, {}, 28);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->Enabled());
}

TEST(O1ResolveTest, PrecedenceIsFieldWise) {
  O1Overrides request, flags, env, hint;
  hint.layers = "all";
  hint.m = 16;
  hint.w = 64;
  hint.sink = 2;
  hint.rect = O1Rect::kFm;  // a hint cannot pin the rectifier
  absl::StatusOr<O1Config> c = ResolveO1Config(request, flags, env, hint, 4);
  ASSERT_TRUE(c.ok());
  EXPECT_THAT(c->layers, ElementsAre(0, 1, 2, 3));
  EXPECT_EQ(c->m, 16u);
  EXPECT_EQ(c->w, 64u);
  EXPECT_EQ(c->sink, 2u);
  EXPECT_EQ(c->rect, O1Rect::kAggregate);

  env.layers = "deep2";
  env.m = 24;
  env.rect = O1Rect::kFm;
  c = ResolveO1Config(request, flags, env, hint, 4);
  ASSERT_TRUE(c.ok());
  EXPECT_THAT(c->layers, ElementsAre(2, 3));
  EXPECT_EQ(c->m, 24u);
  EXPECT_EQ(c->w, 64u);  // still the hint's
  EXPECT_EQ(c->rect, O1Rect::kFm);

  flags.layers = "1";
  flags.w = 96;
  c = ResolveO1Config(request, flags, env, hint, 4);
  ASSERT_TRUE(c.ok());
  EXPECT_THAT(c->layers, ElementsAre(1));
  EXPECT_EQ(c->m, 24u);
  EXPECT_EQ(c->w, 96u);

  request.layers = "0,3";
  request.m = 8;
  request.sink = 0;
  request.rect = O1Rect::kAggregate;
  c = ResolveO1Config(request, flags, env, hint, 4);
  ASSERT_TRUE(c.ok());
  EXPECT_THAT(c->layers, ElementsAre(0, 3));
  EXPECT_EQ(c->m, 8u);
  EXPECT_EQ(c->w, 96u);
  EXPECT_EQ(c->sink, 0u);
  EXPECT_EQ(c->rect, O1Rect::kAggregate);
  EXPECT_TRUE(c->IsO1Layer(3));
  EXPECT_FALSE(c->IsO1Layer(1));
  EXPECT_EQ(c->DebugString(), "o1: layers=[0,3] m=8 w=96 sink=0 rect=aggregate");
}

TEST(O1ResolveTest, OffDisablesAHint) {
  O1Overrides env, hint, request;
  hint.layers = "all";
  env.layers = "off";
  absl::StatusOr<O1Config> c = ResolveO1Config({}, {}, env, hint, 28);
  ASSERT_TRUE(c.ok());
  EXPECT_FALSE(c->Enabled());
  // ... and a request can still turn it back on.
  request.layers = "deep1";
  c = ResolveO1Config(request, {}, env, hint, 28);
  ASSERT_TRUE(c.ok());
  EXPECT_THAT(c->layers, ElementsAre(27));
}

// m and w below the kernel's minimums are refused, naming the field as the
// source spells it, whichever source sets them and whether or not it wins
// (they used to be raised silently to 4 and 1).
TEST(O1ResolveTest, RejectsMAndWBelowTheMinimumsNamingTheField) {
  // By source: 0 request, 1 flags, 2 env, 3 hint.
  const char* m_fields[] = {"request o1.m", "--o1-m", "CMF_O1_M", "config.json o1_attn.m"};
  const char* w_fields[] = {"request o1.window", "--o1-window", "CMF_O1_WINDOW",
                            "config.json o1_attn.w"};
  for (int source = 0; source < 4; ++source) {
    SCOPED_TRACE(m_fields[source]);
    O1Overrides o[4];
    o[0].m = 64;  // the request wins, yet a lower source's bad value is still an error
    o[source].layers = "all";
    o[source].m = kO1MinLandmarks;
    o[source].w = kO1MinWindow;
    absl::StatusOr<O1Config> c = ResolveO1Config(o[0], o[1], o[2], o[3], 2);
    ASSERT_TRUE(c.ok()) << c.status();  // at the minimums
    EXPECT_EQ(c->w, kO1MinWindow);
    o[source].m = kO1MinLandmarks - 1;
    c = ResolveO1Config(o[0], o[1], o[2], o[3], 2);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_EQ(c.status().message(), std::string(m_fields[source]) + ": 3 is below the minimum 4");
    o[source].m = kO1MinLandmarks;
    o[source].w = kO1MinWindow - 1;
    c = ResolveO1Config(o[0], o[1], o[2], o[3], 2);
    ASSERT_FALSE(c.ok());
    EXPECT_EQ(c.status().message(), std::string(w_fields[source]) + ": 0 is below the minimum 1");
  }
}

TEST(O1ResolveTest, EnvironmentBelowTheMinimumsIsRefusedAtResolve) {
  absl::StatusOr<O1Overrides> env = FakeEnv(EnvMap{{"CMF_O1_M", "2"}}).Read();
  ASSERT_TRUE(env.ok()) << env.status();  // well-formed: the minimum is a resolve check
  absl::StatusOr<O1Config> c = ResolveO1Config({}, {}, *env, {}, 6);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("CMF_O1_M: 2 is below the minimum 4"));
  env = FakeEnv(EnvMap{{"CMF_O1_WINDOW", "0"}}).Read();
  ASSERT_TRUE(env.ok()) << env.status();
  c = ResolveO1Config({}, {}, *env, {}, 6);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("CMF_O1_WINDOW: 0 is below the minimum 1"));
}

TEST(O1ResolveTest, BadWinningSpecNamesItsSource) {
  O1Overrides request, hint;
  request.layers = "30";
  absl::StatusOr<O1Config> c = ResolveO1Config(request, {}, {}, {}, 28);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("request"));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("'30'"));
  hint.layers = "deep40";
  c = ResolveO1Config({}, {}, {}, hint, 28);
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("config.json"));
}

TEST(O1ResolveTest, EndToEndFromEnvironmentAndHint) {
  absl::StatusOr<O1Overrides> env =
      FakeEnv({{"CMF_O1_WINDOW", "32"}, {"CMF_O1_RECT", "agg"}}).Read();
  absl::StatusOr<O1Overrides> hint = O1HintFromModelConfig(
      nlohmann::json::parse(R"({"o1_attn": {"layers": "deep2", "w": 256, "m": 2}})"));
  ASSERT_TRUE(env.ok() && hint.ok());
  absl::StatusOr<O1Config> c = ResolveO1Config({}, {}, *env, *hint, 6);
  // The hint's m = 2 is below the kernel's minimum: refused, not raised to 4.
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("config.json o1_attn.m: 2 is below the minimum 4"));
  hint->m = kO1MinLandmarks;
  c = ResolveO1Config({}, {}, *env, *hint, 6);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_THAT(c->layers, ElementsAre(4, 5));
  EXPECT_EQ(c->w, 32u);  // the operator's knob beats the file's suggestion
  EXPECT_EQ(c->m, 4u);   // the hint's
  // The resolved values build a kernel state without tripping its invariants.
  NystromState st = NystromState::New(c->m, c->w, c->sink).WithRect(c->rect);
  EXPECT_EQ(st.NumQHeads(), 1u);
}

}  // namespace
}  // namespace cortiq::kv
