// JinjaTemplate: each feature of the subset, whitespace control, the error
// paths (parse-time refusals with line:column, raise_exception, limits) and
// hostile templates, which must end in errors, never crashes or hangs.
// Expected outputs are what @huggingface/jinja renders (the reference);
// tests/chat/reference_test.cc checks real templates against it directly.
#include "core/chat/jinja.h"

#include <cstdint>
#include <fstream>
#include <random>
#include <sstream>
#include <string>

#include "absl/status/status.h"
#include "gtest/gtest.h"

namespace cortiq::chat {
namespace {

using nlohmann::ordered_json;

absl::StatusOr<std::string> Render(std::string_view source,
                                   const ordered_json& vars = ordered_json::object(),
                                   const jinja::RenderLimits& limits = {}) {
  auto t = JinjaTemplate::Parse(source);
  if (!t.ok()) return t.status();
  JinjaRenderOptions options;
  options.limits = limits;
  options.now = absl::FromCivil(absl::CivilSecond(2024, 7, 26, 13, 5, 0), absl::UTCTimeZone());
  return t->Render(vars, options);
}

std::string R(std::string_view source, const ordered_json& vars = ordered_json::object()) {
  auto out = Render(source, vars);
  EXPECT_TRUE(out.ok()) << source << "\n" << out.status();
  return out.ok() ? *out : "<error: " + std::string(out.status().message()) + ">";
}

std::string ParseError(std::string_view source) {
  auto t = JinjaTemplate::Parse(source);
  EXPECT_FALSE(t.ok()) << source;
  if (t.ok()) return "";
  EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(t.status().message());
}

std::string RenderError(std::string_view source, const ordered_json& vars = ordered_json::object(),
                        const jinja::RenderLimits& limits = {}) {
  auto t = JinjaTemplate::Parse(source);
  EXPECT_TRUE(t.ok()) << t.status();
  if (!t.ok()) return "";
  JinjaRenderOptions options;
  options.limits = limits;
  auto out = t->Render(vars, options);
  EXPECT_FALSE(out.ok()) << source << " rendered " << *out;
  if (out.ok()) return "";
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  return std::string(out.status().message());
}

TEST(JinjaTest, TextExpressionsAndComments) {
  EXPECT_EQ(R("hello"), "hello");
  EXPECT_EQ(R("a{{ 1 + 2 }}b"), "a3b");
  EXPECT_EQ(R("a{# note #}b"), "ab");
  EXPECT_EQ(R("{{ x }}", {{"x", "v"}}), "v");
  EXPECT_EQ(R("[{{ missing }}]"), "[]");
  EXPECT_EQ(R("[{{ none }}]"), "[]");
  EXPECT_EQ(R("{{ true }} {{ True }} {{ false }}"), "true true false");
  EXPECT_EQ(R("one trailing newline is dropped\n"), "one trailing newline is dropped");
}

TEST(JinjaTest, WhitespaceControl) {
  EXPECT_EQ(R("a  {{- 'b' -}}  c"), "abc");
  EXPECT_EQ(R("a \n{%- if true %}b{% endif -%}\n c"), "abc");
  EXPECT_EQ(R("a  {#- x -#}  b"), "ab");
  // trim_blocks: the newline after a block tag goes; lstrip_blocks: the
  // indentation before one goes. Expressions keep both.
  EXPECT_EQ(R("{% if true %}\n  x\n    {% endif %}\nend"), "  x\nend");
  EXPECT_EQ(R("  {{ 'x' }}\n"), "  x");
  EXPECT_EQ(R("{# c #}\nz"), "z");
}

TEST(JinjaTest, Literals) {
  EXPECT_EQ(R("{{ 'a\\n\\t\\'\\\"\\\\' }}"), "a\n\t'\"\\");
  EXPECT_EQ(R("{{ '\\x41\\u00e9\\ud83d\\ude00' }}"), "A\xC3\xA9\xF0\x9F\x98\x80");
  EXPECT_EQ(R("{{ 'a' 'b' }}"), "ab");
  EXPECT_EQ(R("{{ [1, 'two', [3]] }}"), "[1, \"two\", [3]]");
  EXPECT_EQ(R("{{ {'k': 1, 'j': none} }}"), "{\"k\": 1, \"j\": null}");
  EXPECT_EQ(R("{{ (1, 2) }}"), "[1, 2]");
  EXPECT_EQ(R("{{ 1.0 }} {{ 2.50 }} {{ -0.0 }} {{ 7 if false else 3 }}"), "1.0 2.5 -0.0 3");
  EXPECT_EQ(R("{{ 10 / 4 }} {{ 10 // 4 }} {{ -7 // 2 }} {{ 7 % 3 }} {{ 2 ** 10 }} {{ 2 ** -1 }}"),
            "2.5 2 -4 1 1024 0.5");
  EXPECT_EQ(R("{{ 0.1 + 0.2 }} {{ 1000000000000000000000 / 1 }} {{ 1 / 3 }}"),
            "0.30000000000000004 1e+21 0.3333333333333333");
  EXPECT_EQ(R("{{ 'a' ~ 1 ~ 1.0 ~ true }}"), "a11true");
  EXPECT_EQ(R("{{ 'n=' + 2 }}"), "n=2");
}

TEST(JinjaTest, Operators) {
  EXPECT_EQ(R("{{ 1 < 2 and 2 <= 2 and 3 > 2 and 3 >= 3 and 1 != 2 }}"), "true");
  EXPECT_EQ(R("{{ 'a' in 'cat' }} {{ 'z' not in 'cat' }} {{ 2 in [1, 2] }} {{ 'k' in {'k': 1} }}"),
            "true true true true");
  EXPECT_EQ(R("{{ 'x' in undefined_thing }} {{ 'x' not in undefined_thing }}"), "false true");
  EXPECT_EQ(R("{{ none or 'd' }} {{ 0 and 'x' }} {{ [] or 'e' }}"), "d 0 e");
  EXPECT_EQ(R("{{ not none }} {{ not not 1 }}"), "true true");
  EXPECT_EQ(R("{{ 'y' if 1 else 'n' }}{{ 'y' if 0 else 'n' }}{{ 'only' if false }}|"), "yn|");
  // JavaScript loose equality, as the reference compares.
  EXPECT_EQ(R("{{ 1 == 1.0 }} {{ '1' == 1 }} {{ none == undefined_thing }} {{ [1] == [1] }}"),
            "true true true false");
  EXPECT_EQ(R("{{ [1] + [2] }}"), "[1, 2]");
  EXPECT_EQ(R("{{ -x }} {{ +x }}", {{"x", 3}}), "-3 3");
}

TEST(JinjaTest, MemberIndexAndSlices) {
  const ordered_json vars = {{"m", {{"role", "user"}, {"list", {1, 2, 3, 4}}}},
                             {"s", "h\xC3\xA9llo"}};
  EXPECT_EQ(R("{{ m.role }} {{ m['role'] }} {{ m.nothing }}|{{ m.nothing.deeper }}|", vars),
            "user user ||");
  EXPECT_EQ(
      R("{{ m.list[0] }} {{ m.list[-1] }} {{ m.list[1:] }} {{ m.list[::-1] }} {{ m.list[:2] }}",
        vars),
      "1 4 [2, 3, 4] [4, 3, 2, 1] [1, 2]");
  EXPECT_EQ(R("{{ m.list[::2] }} {{ m.list[5:] }} {{ m.list[-2:] }}", vars), "[1, 3] [] [3, 4]");
  EXPECT_EQ(R("{{ s[1] }} {{ s[1:3] }} {{ s[::-1] }} {{ s|length }}", vars),
            "\xC3\xA9 \xC3\xA9l oll\xC3\xA9h 5");
  EXPECT_EQ(R("{{ m.list.length }} {{ s.length }}", vars), "4 5");
  EXPECT_EQ(R("{{ '\xF0\x9F\x98\x80'|length }}"), "2");  // UTF-16 code units
}

TEST(JinjaTest, StringMethods) {
  EXPECT_EQ(R("{{ ' a b '.strip() }}|{{ ' a '.lstrip() }}|{{ ' a '.rstrip() }}|"), "a b|a | a|");
  // The reference's strip ignores its argument: all whitespace goes.
  EXPECT_EQ(R("{{ '\\n \\tx\\n '.strip('\\n') }}|{{ '\\n  x'.lstrip('\\n') }}|"), "x|x|");
  EXPECT_EQ(R("{{ 'abc'.startswith('ab') }} {{ 'abc'.endswith(('x', 'bc')) }}"), "true true");
  EXPECT_EQ(R("{{ 'a,b,,c'.split(',') }} {{ ' a  b '.split() }} {{ 'a,b,c'.split(',', 1) }}"),
            "[\"a\", \"b\", \"\", \"c\"] [\"a\", \"b\"] [\"a\", \"b,c\"]");
  EXPECT_EQ(R("{{ 'x</think>y'.split('</think>')[-1] }}"), "y");
  EXPECT_EQ(R("{{ 'aaa'.replace('a', 'b', 2) }} {{ 'ab'.replace('', '-') }}"), "bba -a-b-");
  EXPECT_EQ(R("{{ 'hello world'.title() }} {{ 'hello'.capitalize() }} {{ 'MiX'.lower() }} {{ "
              "'mix'.upper() }}"),
            "Hello World Hello mix MIX");
  EXPECT_EQ(R("{{ '\xC3\xA9t\xC3\xA9'.upper() }} {{ '\xCE\x9F\xCE\xA3'.lower() }}"),
            "\xC3\x89T\xC3\x89 \xCE\xBF\xCF\x82");
}

TEST(JinjaTest, Filters) {
  const ordered_json vars = {
      {"xs", {3, 1, 2}},
      {"words", {"b", "A", "c"}},
      {"people",
       {{{"name", "a"}, {"age", 3}, {"on", true}}, {{"name", "b"}, {"age", 1}, {"on", false}}}},
      {"d", {{"k", "v"}, {"n", 1}}}};
  EXPECT_EQ(R("{{ xs|length }} {{ xs|first }} {{ xs|last }} {{ xs|reverse }} {{ xs|sort }}", vars),
            "3 3 2 [2, 1, 3] [1, 2, 3]");
  EXPECT_EQ(R("{{ words|sort }} {{ words|join }} {{ words|join(', ') }} {{ xs|join('-') }}", vars),
            "[\"A\", \"b\", \"c\"] bAc b, A, c 3-1-2");
  EXPECT_EQ(R("{{ [1, 1, 2]|unique }} {{ xs|list }} {{ xs|string }}", vars),
            "[1, 2] [3, 1, 2] [3, 1, 2]");
  EXPECT_EQ(R("{{ people|selectattr('on')|map(attribute='name')|list }}", vars), "[\"a\"]");
  EXPECT_EQ(R("{{ people|rejectattr('on')|map(attribute='name')|join }}", vars), "b");
  EXPECT_EQ(R("{{ people|selectattr('name', 'equalto', 'b')|map(attribute='age')|first }}", vars),
            "1");
  EXPECT_EQ(R("{{ people|sort(attribute='age')|map(attribute='name')|join }}", vars), "ba");
  EXPECT_EQ(R("{{ people|map(attribute='x', default='?')|join }}", vars), "??");
  EXPECT_EQ(
      R("{{ d|items }} {{ d|length }} {% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}",
        vars),
      "[[\"k\", \"v\"], [\"n\", 1]] 2 k=v;n=1;");
  EXPECT_EQ(R("{{ d.get('k') }} {{ d.get('z', 'dflt') }} {{ d.keys() }} {{ d.values() }}", vars),
            "v dflt [\"k\", \"n\"] [\"v\", 1]");
  EXPECT_EQ(R("{{ '  x '|trim }}|{{ 'abc'|upper }}|{{ 'ABC'|lower }}|{{ 'ab cd'|title }}|{{ "
              "'ab'|capitalize }}"),
            "x|ABC|abc|Ab Cd|Ab");
  EXPECT_EQ(R("{{ 'a b a'|replace('a', 'x') }} {{ '12'|int + 1 }} {{ '1.5'|float }} {{ 'z'|int }} "
              "{{ 2.7|int }}"),
            "x b x 13 1.5 0 2");
  EXPECT_EQ(R("{{ 3|string ~ 1.0|string }} {{ -3|abs }} {{ 2.5|round }} {{ 3.14159|round(2) }} {{ "
              "true|int }}"),
            "31.0 3 2.0 3.14 1");
  EXPECT_EQ(R("{{ missing|default('d') }} {{ ''|default('e', true) }} {{ 'x'|default('f') }}"),
            "d e x");
  EXPECT_EQ(R("{{ 'a\\nb\\n\\nc'|indent }}|{{ 'a\\nb'|indent(2, true) }}"),
            "a\n    b\n\n    c|  a\n  b");
  EXPECT_EQ(R("{{ '<b>'|safe }}"), "<b>");
  EXPECT_EQ(R("{% filter upper %}abc{% endfilter %}"), "ABC");
}

TEST(JinjaTest, ToJson) {
  const ordered_json vars = ordered_json::parse(
      R"({"t": {"name": "f", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}, "n": [], "e": {}},
          "s": "quote\" back\\ nl\n tab\t ctl\u0001 é 😀", "num": [1, 1.5, -0.0, 1e300, 100000000000000000000000]})");
  EXPECT_EQ(
      R("{{ t|tojson }}", vars),
      R"({"name": "f", "parameters": {"type": "object", "properties": {"q": {"type": "string"}}, "required": ["q"]}, "n": [], "e": {}})");
  EXPECT_EQ(R("{{ t|tojson(indent=2) }}", vars),
            "{\n  \"name\": \"f\",\n  \"parameters\": {\n    \"type\": \"object\",\n    "
            "\"properties\": {\n"
            "      \"q\": {\n        \"type\": \"string\"\n      }\n    },\n    \"required\": [\n  "
            "    \"q\"\n"
            "    ]\n  },\n  \"n\": [],\n  \"e\": {}\n}");
  EXPECT_EQ(R("{{ s|tojson }}", vars),
            "\"quote\\\" back\\\\ nl\\n tab\\t ctl\\u0001 \xC3\xA9 \xF0\x9F\x98\x80\"");
  EXPECT_EQ(R("{{ s|tojson(ensure_ascii=true) }}", vars),
            "\"quote\\\" back\\\\ nl\\n tab\\t ctl\\u0001 \\u00e9 \\ud83d\\ude00\"");
  EXPECT_EQ(R("{{ num|tojson }}", vars), "[1, 1.5, 0, 1e+300, 1e+23]");
  EXPECT_EQ(R("{{ {'a': 1, 'b': [2]}|tojson(separators=(',', ':')) }}"), "{\"a\":1,\"b\":[2]}");
  // Array-index-like keys come first, as after JSON.parse in JavaScript.
  EXPECT_EQ(R("{{ o|tojson }}", ordered_json::parse(R"({"o": {"b": 1, "2": 2, "a": 3, "1": 4}})")),
            R"({"1": 4, "2": 2, "b": 1, "a": 3})");
  EXPECT_EQ(R("{{ missing|tojson }}"), "null");
}

TEST(JinjaTest, Tests) {
  const ordered_json vars = {{"s", "x"}, {"n", 1},          {"f", 1.5},
                             {"l", {1}}, {"m", {{"a", 1}}}, {"z", nullptr}};
  EXPECT_EQ(
      R("{{ s is string }}{{ n is number }}{{ f is number }}{{ n is integer }}{{ f is integer }}",
        vars),
      "truetruetruetruefalse");
  EXPECT_EQ(R("{{ l is iterable }}{{ s is iterable }}{{ m is iterable }}{{ m is mapping }}{{ l is "
              "mapping }}",
              vars),
            "truetruefalsetruefalse");
  EXPECT_EQ(R("{{ l is sequence }}{{ z is none }}{{ z is not none }}{{ q is defined }}{{ q is "
              "undefined }}",
              vars),
            "truetruefalsefalsetrue");
  EXPECT_EQ(R("{{ true is true }}{{ 1 is true }}{{ false is false }}{{ true is boolean }}{{ 3 is "
              "odd }}{{ 4 is even }}"),
            "truefalsetruetruetruetrue");
  EXPECT_EQ(R("{{ 'ab' is lower }}{{ 'AB' is upper }}{{ range is callable }}"), "truetruetrue");
}

TEST(JinjaTest, ForLoops) {
  const ordered_json vars = {{"xs", {"a", "b", "c"}}};
  EXPECT_EQ(
      R("{% for x in xs %}{{ loop.index }}{{ loop.index0 }}{{ x }}{{ loop.first }}{{ loop.last }}"
        "{{ loop.length }}{{ loop.revindex }};{% endfor %}",
        vars),
      "10atruefalse33;21bfalsefalse32;32cfalsetrue31;");
  EXPECT_EQ(
      R("{% for x in xs %}{{ loop.previtem }}>{{ x }}>{{ loop.nextitem }} {% endfor %}", vars),
      ">a>b a>b>c b>c> ");
  EXPECT_EQ(R("{% for x in [] %}x{% else %}empty{% endfor %}"), "empty");
  EXPECT_EQ(R("{% for x in xs if x != 'b' %}{{ x }}{{ loop.index }}{% endfor %}", vars), "a1c2");
  EXPECT_EQ(
      R("{% for x in xs %}{% if x == 'b' %}{% continue %}{% endif %}{{ x }}{% endfor %}", vars),
      "ac");
  EXPECT_EQ(R("{% for x in xs %}{% if x == 'b' %}{% break %}{% endif %}{{ x }}{% endfor %}", vars),
            "a");
  EXPECT_EQ(R("{% for i in range(3) %}{{ i }}{% endfor %}{% for i in range(5, 1, -2) %}{{ i }}{% "
              "endfor %}"),
            "01253");
  EXPECT_EQ(R("{% for a, b in [[1, 2], [3, 4]] %}{{ a + b }},{% endfor %}"), "3,7,");
  EXPECT_EQ(R("{% for k in {'x': 1, 'y': 2} %}{{ k }}{% endfor %}"), "xy");
  // A for loop opens a scope: a set inside does not leak out.
  EXPECT_EQ(R("{% set v = 1 %}{% for x in xs %}{% set v = 2 %}{% endfor %}{{ v }}", vars), "1");
}

TEST(JinjaTest, SetNamespaceMacroCall) {
  EXPECT_EQ(R("{% set a, b = 1, 2 %}{{ a }}{{ b }}"), "12");
  EXPECT_EQ(
      R("{% set ns = namespace(found=false, n=0) %}{% for i in range(3) %}{% set ns.n = ns.n + i %}"
        "{% set ns.found = true %}{% endfor %}{{ ns.found }} {{ ns.n }}"),
      "true 3");
  EXPECT_EQ(R("{% set block %}in {{ 1 }}{% endset %}[{{ block }}]"), "[in 1]");
  EXPECT_EQ(
      R("{% macro greet(name, punct='!') %}hi {{ name }}{{ punct }}{% endmacro %}{{ greet('a') }} "
        "{{ greet('b', punct='?') }}"),
      "hi a! hi b?");
  EXPECT_EQ(R("{% macro wrap() %}<{{ caller() }}>{% endmacro %}{% call wrap() %}body{% endcall %}"),
            "<body>");
  EXPECT_EQ(R("{% macro m() %}{{ varargs }}{{ kwargs }}{% endmacro %}{{ m(1, 2, k=3) }}"),
            "[1, 2]{\"k\": 3}");
  EXPECT_EQ(R("{{ strftime_now('%d %b %Y %H:%M %B %m %%') }}"), "26 Jul 2024 13:05 July 07 %");
}

TEST(JinjaTest, RaiseExceptionIsAnErrorCarryingTheMessage) {
  auto t = JinjaTemplate::Parse(
      "{% if x %}{{ raise_exception('Conversation roles must alternate') }}{% endif %}");
  ASSERT_TRUE(t.ok());
  auto out = t->Render({{"x", true}}, {});
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(out.status().message(), "Conversation roles must alternate");
  EXPECT_TRUE(JinjaTemplate::IsRaisedError(out.status()));
  EXPECT_EQ(*t->Render({{"x", false}}, {}), "");
}

TEST(JinjaTest, UnsupportedFeaturesFailAtParseWithLineAndColumn) {
  EXPECT_EQ(ParseError("a\nb {% include 'x.j2' %}"),
            "chat_template:2:6: unsupported tag 'include'");
  EXPECT_EQ(ParseError("{% extends 'base' %}"), "chat_template:1:4: unsupported tag 'extends'");
  EXPECT_EQ(ParseError("{{ x | wordcount }}"), "chat_template:1:8: unsupported filter 'wordcount'");
  EXPECT_EQ(ParseError("{% if x is divisibleby(3) %}{% endif %}"),
            "chat_template:1:12: unsupported test 'divisibleby'");
  EXPECT_EQ(ParseError("\n\n  {{ cycler(1, 2) }}"),
            "chat_template:3:6: unsupported function 'cycler'");
  EXPECT_EQ(ParseError("{{ 'a'.zfill(3) }}"), "chat_template:1:8: unsupported method 'zfill'");
  EXPECT_EQ(ParseError("{{ x|tojson(sort_keys=true) }}"),
            "chat_template:1:13: unsupported tojson argument 'sort_keys'");
  EXPECT_EQ(ParseError("{% for x in y %}"),
            "chat_template:1:4: unclosed 'for' tag: no matching end tag");
  EXPECT_EQ(ParseError("{% endif %}"), "chat_template:1:4: unexpected tag 'endif'");
  EXPECT_EQ(ParseError("{{ 'open }}"), "chat_template:1:4: unterminated string literal");
  EXPECT_EQ(ParseError("{{ a ! b }}"), "chat_template:1:6: unexpected character '!'");
  EXPECT_EQ(ParseError("{# no end"), "chat_template:1:1: missing end of comment tag '#}'");
  EXPECT_NE(ParseError("{{ x|map('upper') }}").find("attribute="), std::string::npos);
  EXPECT_NE(ParseError(std::string("\xFF")).find("not valid UTF-8"), std::string::npos);
  // Macros may be called before they are defined; names bound by set are callable.
  EXPECT_TRUE(JinjaTemplate::Parse("{{ m() }}{% macro m() %}x{% endmacro %}").ok());
}

// tojson checks the output limit while it builds: an indented dump of a
// deep, wide value (a client's tools) grows far past the value, and was
// refused only once whole (hundreds of MB at the default limits).
TEST(JinjaTest, TojsonStopsAtTheOutputLimitWhileItBuilds) {
  ordered_json v = ordered_json::array();
  for (int i = 0; i < 2000; ++i) v.push_back(0);
  for (int d = 0; d < 20; ++d) v = ordered_json::array({v});
  jinja::RenderLimits small;
  small.max_output_bytes = 100000;  // the value dumps in ~6 KB flat, ~200 KB indented
  const std::string e = RenderError("{{ t|tojson(indent=4) }}", {{"t", v}}, small);
  EXPECT_NE(e.find("tojson: the output passes the limit of 100000 bytes"), std::string::npos) << e;
  EXPECT_EQ(R("{{ t|tojson|length > 5000 }}", {{"t", v}}), "true");
  small.max_output_bytes = 5000;
  EXPECT_NE(RenderError("{{ t|tojson }}", {{"t", v}}, small).find("tojson: the output passes"),
            std::string::npos);
  EXPECT_EQ(R("{{ [[1, 2]]|tojson(indent=1) }}"), "[\n [\n  1,\n  2\n ]\n]");
}

// range() past 2^53, where adding 1 no longer moves a double: the charged
// count of elements, each start + k * step (the loop never ended before).
TEST(JinjaTest, RangePastTwoToThe53Ends) {
  EXPECT_EQ(R("{{ range(10000000000000000, 10000000000000004)|length }}"), "4");
  EXPECT_EQ(R("{{ range(5, 1, -2)|list|join(',') }}"), "5,3");
}

TEST(JinjaTest, RenderErrorsNameThePosition) {
  EXPECT_EQ(RenderError("{{ 'a' }}\n{{ x + 1 }}"),
            "chat_template:2:6: Cannot perform operation + on undefined values");
  EXPECT_EQ(RenderError("{{ x.strip() }}", {{"x", 1}}),
            "chat_template:1:5: Cannot call something that is not a function: got UndefinedValue");
  EXPECT_NE(RenderError("{{ '</think>' in none }}").find("null"), std::string::npos);
  EXPECT_NE(RenderError("{% break %}").find("outside a loop"), std::string::npos);
}

TEST(JinjaTest, VariablesMayNotShadowBuiltins) {
  auto t = JinjaTemplate::Parse("{{ true }}");
  ASSERT_TRUE(t.ok());
  auto out = t->Render({{"true", 0}}, {});
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("'true'"), std::string::npos);
}

TEST(JinjaTest, LimitsEndInErrors) {
  jinja::RenderLimits small;
  small.max_output_bytes = 1000;
  EXPECT_NE(
      RenderError("{% for i in range(200) %}0123456789{% endfor %}", ordered_json::object(), small)
          .find("limit of 1000 bytes"),
      std::string::npos);
  EXPECT_NE(RenderError("{% for i in range(100000000) %}{% endfor %}").find("loop iterations"),
            std::string::npos);
  EXPECT_NE(
      RenderError("{% for i in range(1000) %}{% for j in range(1000) %}{% for k in range(1000) %}"
                  "{% endfor %}{% endfor %}{% endfor %}")
          .find("limit"),
      std::string::npos);
  EXPECT_NE(RenderError("{% macro r(n) %}{{ r(n + 1) }}{% endmacro %}{{ r(0) }}")
                .find("macro calls nested"),
            std::string::npos);
  // Doubling a string: the string cap ends it long before memory does.
  EXPECT_NE(
      RenderError(
          "{% set ns = namespace(s='x') %}{% for i in range(64) %}{% set ns.s = ns.s + ns.s %}"
          "{% endfor %}{{ ns.s|length }}")
          .find("limit"),
      std::string::npos);
  EXPECT_NE(
      RenderError("{% set ns = namespace(v=[]) %}{% for i in range(100) %}{% set ns.v = [ns.v] %}"
                  "{% endfor %}{{ ns.v|tojson }}")
          .find("nested deeper"),
      std::string::npos);
  EXPECT_NE(RenderError("{% set ns = namespace() %}{% set ns.self = ns %}").find("namespace"),
            std::string::npos);
  jinja::RenderLimits few_steps;
  few_steps.max_steps = 1000;
  EXPECT_NE(RenderError("{% for i in range(10000) %}{{ i }}{% endfor %}", ordered_json::object(),
                        few_steps)
                .find("steps"),
            std::string::npos);
  // Deep input values are refused.
  ordered_json deep = 1;
  for (int i = 0; i < 200; ++i) deep = ordered_json::array({deep});
  EXPECT_NE(RenderError("{{ x }}", {{"x", deep}}).find("nested deeper"), std::string::npos);
}

TEST(JinjaTest, DeepTemplatesFailAtParse) {
  std::string parens(5000, '(');
  EXPECT_NE(
      ParseError("{{ " + parens + "1" + std::string(5000, ')') + " }}").find("nested too deeply"),
      std::string::npos);
  std::string ifs;
  for (int i = 0; i < 500; ++i) ifs += "{% if true %}";
  for (int i = 0; i < 500; ++i) ifs += "{% endif %}";
  EXPECT_NE(ParseError(ifs).find("nested too deeply"), std::string::npos);
  std::string chain = "{{ 1";
  for (int i = 0; i < 100000; ++i) chain += " + 1";
  EXPECT_NE(ParseError(chain + " }}").find("nested too deeply"), std::string::npos);
  std::string filters = "{{ 'x'";
  for (int i = 0; i < 100000; ++i) filters += "|trim";
  EXPECT_NE(ParseError(filters + " }}").find("nested too deeply"), std::string::npos);
  std::string nots = "{{ ";
  for (int i = 0; i < 100000; ++i) nots += "not ";
  EXPECT_NE(ParseError(nots + "x }}").find("nested too deeply"), std::string::npos);
  EXPECT_NE(ParseError(std::string(kMaxTemplateBytes + 1, 'x')).find("exceeds the limit"),
            std::string::npos);
}

// Random byte mutations of the real Qwen3 template: Parse may fail, and what
// parses must render to a result or an error, never crash or hang.
TEST(JinjaTest, MutatedTemplatesNeverCrash) {
  std::ifstream in(CORTIQ_SOURCE_DIR "/tests/chat/data/qwen3_chat_template.jinja");
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string base = ss.str();
  ASSERT_GT(base.size(), 1000u);
  const ordered_json vars = ordered_json::parse(R"({
    "messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "q"},
                 {"role": "assistant", "content": "<think>r</think>a", "tool_calls": [{"function": {"name": "f", "arguments": {"x": 1}}}]},
                 {"role": "tool", "content": "t"}],
    "tools": [{"type": "function", "function": {"name": "f"}}], "add_generation_prompt": true})");
  std::mt19937 rng(1234);
  const std::string alphabet = "{}%#-+*/()[]|.,:'\"=<>~ \n abcfinoprstxyz0123456789";
  int parsed = 0, rendered = 0;
  for (int iter = 0; iter < 1500; ++iter) {
    std::string s = base;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % s.size();
      switch (rng() % 3) {
        case 0:
          s[pos] = alphabet[rng() % alphabet.size()];
          break;
        case 1:
          s.erase(pos, 1 + rng() % 8);
          break;
        default:
          s.insert(pos, 1, alphabet[rng() % alphabet.size()]);
      }
    }
    auto t = JinjaTemplate::Parse(s);
    if (!t.ok()) {
      EXPECT_EQ(t.status().code(), absl::StatusCode::kInvalidArgument);
      continue;
    }
    ++parsed;
    JinjaRenderOptions options;
    options.limits.max_steps = 200000;
    auto out = t->Render(vars, options);
    if (out.ok()) ++rendered;
  }
  EXPECT_GT(parsed, 0);
  EXPECT_GT(rendered, 0);
}

}  // namespace
}  // namespace cortiq::chat
