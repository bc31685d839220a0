#!/usr/bin/python3
"""Writes tests/tokenizer/data/corpus.jsonl: the strings on which our tokenizer
must give the same ids as the JS reference (tools/tokenizer/reference_ids.mjs).

Each line is {"id": N, "category": "...", "text": "..."}, or, for byte strings
that are not valid UTF-8, {"id": N, "category": "invalid_utf8", "hex": "..."}.
Deterministic (fixed seed): rerunning it rewrites the same file.

  /usr/bin/python3 tools/tokenizer/make_corpus.py
  node tools/tokenizer/reference_ids.mjs

Fuzzing (not committed): --random N --seed S --out PATH writes N adversarial
random strings instead; then
  node tools/tokenizer/reference_ids.mjs PATH REF_PATH
  CORTIQ_TOKENIZER_CORPUS=PATH CORTIQ_TOKENIZER_REFERENCE=REF_PATH \
      build/tests/tokenizer_qwen3_reference_test

Letters and digits are kept to code points assigned by Unicode 14.0 (the
version of our generated tables; Node's ICU is newer).
"""

import argparse
import json
import os
import random
import unicodedata

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests", "tokenizer", "data", "corpus.jsonl")

PROSE = [
    "It was a bright cold day in April, and the clocks were striking thirteen. "
    "Nobody on the street seemed to notice; they hurried past the shuttered "
    "bakery with their collars turned up against the wind.",
    "The committee met on Tuesday to discuss the budget for the coming year. "
    "After three hours of debate, the members agreed to postpone the decision "
    "until the auditors had finished reviewing last quarter's accounts.",
    "She opened the letter slowly, as if the paper itself might bite. Inside was "
    "a single photograph of a lighthouse, and on the back, in faded ink, someone "
    "had written: \"Come home before the tide turns.\"",
    "Photosynthesis converts light energy into chemical energy. In the chloroplasts "
    "of plant cells, water is split, oxygen is released, and carbon dioxide is fixed "
    "into sugars that feed nearly every food chain on the planet.",
    "We'll need at least forty volunteers for the festival: twelve at the gates, "
    "ten in the kitchen, and the rest wherever they're needed most. If you can't "
    "make it on Saturday, please let us know by Thursday evening.",
    "The old man had fished alone in a skiff for many weeks without taking a single "
    "fish. The boy's parents had told him the man was unlucky, the worst kind of "
    "unlucky, and that he should go with another boat.",
    "According to the report, global shipping volumes rose by 4.2 percent in 2023, "
    "driven largely by demand for electronics and agricultural goods. Analysts expect "
    "growth to slow as freight rates normalise.",
    "Mountains do not care about schedules. The weather closed in by noon, and the "
    "climbers, who had planned to reach the summit before two o'clock, sat in their "
    "tents listening to the canvas snap and roar.",
    "Good software is written twice: once to understand the problem and once to "
    "solve it. The first draft teaches you what you didn't know you needed; the "
    "second one is the one you keep.",
    "The museum's new wing houses more than three hundred paintings, most of them "
    "donated by a single family over the course of a century. Visitors often linger "
    "in the small gallery of winter landscapes at the far end.",
    "\"I don't think that's what he meant,\" Mary said, folding the napkin into a "
    "neat triangle. \"He's always been careful with words. If he'd wanted to say "
    "no, he would've said it.\"",
    "Rivers shape the land in ways both sudden and slow. A single flood can carve a "
    "new channel overnight, while the patient work of sediment builds deltas over "
    "thousands of years.",
    "Please remember to bring your identification, a pen, and a printed copy of "
    "your confirmation email. Doors open at 8:30 a.m.; late arrivals will not be "
    "admitted once the examination has begun.",
    "The recipe calls for two cups of flour, a teaspoon of baking soda, half a cup "
    "of sugar, and three ripe bananas. Mash the bananas first, then fold in the dry "
    "ingredients until just combined.",
    "History is rarely as tidy as textbooks suggest. Causes overlap, records are lost, "
    "and the people who lived through events seldom knew which of them would later "
    "be called turning points.",
    "In the quiet hours after midnight the city sounded different: a distant siren, "
    "the hum of a refrigerator truck, the clatter of a lone cyclist crossing the "
    "cobblestones near the river.",
    "Our quarterly results exceeded expectations. Revenue grew 12% year over year, "
    "operating margins improved, and we shipped the long-awaited update to every "
    "customer without a single rollback.",
    "The children had built a fort out of blankets and chairs, and they refused to "
    "come out for dinner until someone agreed to pay the toll: one story, told with "
    "all the voices.",
    "Language models predict the next token given the previous ones. Tokenizers decide "
    "what a token is, and small differences there ripple through everything that "
    "follows, from training to inference.",
    "He kept a notebook in his coat pocket and wrote down things he overheard on the "
    "train: fragments of arguments, half-finished jokes, the names of places he had "
    "never been and probably never would go.",
]

CODE = [
    "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "import numpy as np\n\nx = np.linspace(0, 1, 101)\nprint(f\"mean={x.mean():.3f}\")\n",
    "#include <iostream>\n\nint main() {\n  std::cout << \"Hello, world!\" << std::endl;\n  return 0;\n}\n",
    "template <typename T>\nT Max(const T& a, const T& b) { return a < b ? b : a; }\n",
    "const add = (a, b) => a + b;\nconsole.log(add(2, 3)); // 5\n",
    "fn main() {\n    let v: Vec<i32> = (1..=10).collect();\n    println!(\"{:?}\", v);\n}\n",
    "package main\n\nimport \"fmt\"\n\nfunc main() {\n\tfmt.Println(\"tabs\\tand\\tnewlines\")\n}\n",
    "public class Hello {\n    public static void main(String[] args) {\n        System.out.println(\"Hi\");\n    }\n}\n",
    "SELECT name, COUNT(*) AS n\nFROM users\nWHERE created_at >= '2024-01-01'\nGROUP BY name\nORDER BY n DESC;\n",
    "<!DOCTYPE html>\n<html lang=\"en\">\n<head><title>Test</title></head>\n<body><p class=\"x\">Hi &amp; bye</p></body>\n</html>\n",
    "{\"name\": \"cortiq\", \"version\": \"0.1.0\", \"tags\": [\"llm\", \"cpu\"], \"ok\": true, \"n\": null}",
    "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do\n  wc -l \"$f\"\ndone\n",
    "server:\n  port: 8080\n  hosts:\n    - 127.0.0.1\n    - ::1\n  debug: false\n",
    "# Title\n\n* item one\n* item **two**\n\n```python\nprint('hi')\n```\n",
    "\\begin{equation}\n  E = mc^2 \\quad \\text{and} \\quad \\int_0^1 x^2\\,dx = \\frac{1}{3}\n\\end{equation}\n",
    "if (x != nullptr && x->size() > 0) { y += x->at(0); } else { y = -1; }",
    "while True:\r\n    line = input()\r\n    if not line:\r\n        break\r\n",
    "    indented with four spaces\n\tindented with a tab\n        eight spaces\n",
    "a=1;b=2;c=a<<b|0xFF&~0b1010;d=a>=b||c<=a&&!d;",
    "x += 1  # trailing comment   \ny -= 2\t\t\nz *= 3 \n",
    "regex = r\"(?i:'s|'t)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+\"",
    "SELECT * FROM t WHERE s LIKE '%don''t%';",
    "let s = 'it''s'; let t = \"can't\"; let u = `won't ${x}`;",
    "def f():\n    return {'a': [1, 2, 3], 'b': (4, 5)}\n\n\n\nclass C:\n    pass\n",
    "   \n\n   \n\t\n",
]

NUMBERS = [
    "3.14159265358979323846264338327950288419716939937510",
    "1,234,567.89", "0.000001", "6.022e23", "-42", "+7", "1e-9", "0xDEADBEEF", "0b101010",
    "v1.2.3-rc.4+build.567", "2024-02-29T23:59:59Z", "+1 (555) 010-9999", "192.168.0.1",
    "12345678901234567890123456789012345678901234567890",
    "9" * 120, "1 2 3 4 5 6 7 8 9 10", "100%", "$1,000,000", "€2.50", "¥500", "£3.99",
    "١٢٣٤٥٦٧٨٩٠", "०१२३४५६७८९", "๑๒๓", "²³¹", "½ ¼ ¾", "Ⅻ ⅷ", "１２３４５", "𝟙𝟚𝟛",
    "3rd 21st 42nd 100th", "4x4", "A4", "x86_64", "COVID-19", "MP3", "2π", "10km/h",
]

WHITESPACE = [
    " ", "  ", "   ", "\t", "\t\t", "\n", "\n\n", "\n\n\n\n", "\r\n", "\r\n\r\n", "\r", " \n", "\n ",
    " \n ", "a  b", "a   b", "a\tb", "a \tb", "a\t b", "trailing   ", "   leading", "  both  ",
    "line1\nline2\r\nline3\rline4", "para one.\n\n\npara two.", "a\u00a0b", "a\u00a0\u00a0b",
    "a\u3000b", "a\u2028b", "a\u2029b", "a\u2003b", "a\u202fb", "\u200bzero\u200bwidth",
    "tab\tseparated\tvalues\n1\t2\t3\n", " " * 100, "\n" * 50, " \t \n \t \n",
    "end with newline\n", "end with spaces and newline  \n", "x\n\t\ty", "x \n y",
    "\v\f", "a\vb\fc", "  \r\n  ", "\t\r\n",
]

CJK_AND_SCRIPTS = [
    "你好，世界！今天天气很好。", "我爱北京天安门。", "中华人民共和国成立于1949年。",
    "日本語のテキストです。ひらがなとカタカナ。", "東京タワーに行きました。",
    "한국어 텍스트입니다. 안녕하세요!", "대한민국의 수도는 서울입니다.",
    "مرحبا بالعالم، كيف حالك؟", "اللغة العربية جميلة جدا.",
    "नमस्ते दुनिया, आप कैसे हैं?", "हिन्दी भारत की राजभाषा है।",
    "สวัสดีครับ ยินดีต้อนรับ", "ภาษาไทยไม่มีการเว้นวรรคระหว่างคำ",
    "שלום עולם", "Привет, мир! Как дела?", "Γειά σου Κόσμε", "Ελληνικά: αβγδεζηθ",
    "Tiếng Việt có nhiều dấu: ắ ằ ẳ ẵ ặ", "ქართული ენა", "Հայերեն լեզու", "ᚠᚢᚦᚨᚱᚲ",
    "中文English混合mixed文本", "日本語とEnglishのmix", "数字123和字母abc",
    "𠀀𠀁𠀂 (CJK extension B)", "𝐀𝐁𝐂 𝑎𝑏𝑐 (math letters)", "ｆｕｌｌ ｗｉｄｔｈ",
]

EMOJI = [
    "👍", "👍🏽", "👍🏿 great job", "❤️", "❤️‍🔥", "👨‍👩‍👧‍👦 family", "🏳️‍🌈", "🏴‍☠️",
    "🇯🇵🇺🇸🇩🇪", "1️⃣2️⃣3️⃣", "#️⃣", "🧑🏻‍💻 coding", "👩🏾‍🚀", "😀😃😄😁", "🙂 ok 🙃",
    "I love 🍕 and 🍣!", "🎉🎉🎉", "✅ done ❌ failed ⚠️ warning", "☺︎ text style", "☺️ emoji style",
    "👋🏻👋🏼👋🏽👋🏾👋🏿", "🤷‍♀️🤷‍♂️", "🐈‍⬛", "⭐️⭐️⭐️⭐️☆",
]

ACCENT_WORDS = [
    "café", "naïve", "résumé", "Ångström", "über", "Straße", "façade", "jalapeño", "crème brûlée",
    "Dvořák", "Łódź", "São Paulo", "Zürich", "coöperate", "Ελλάδα", "Thành phố Hồ Chí Minh",
    "ñandú", "Øresund", "smørrebrød", "İstanbul",
]

CONTRACTION_BASES = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]

SPECIAL = [
    "<|endoftext|>", "<|im_start|>", "<|im_end|>",
    "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nHi!<|im_end|>\n<|im_start|>assistant\n",
    "Hello<|endoftext|>World", "<|im_end|><|im_start|>", "text<|im_end|>", "<|im_end|>text",
    " <|im_end|> ", "\n<|im_start|>\n", "<|im_end", "<|im_end|>>", "<<|endoftext|>>", "<|endoftext|",
    "<think>\nLet me think.\n</think>\n\nAnswer.", "<tool_call>\n{\"name\": \"f\"}\n</tool_call>",
    "<|fim_prefix|>def f():<|fim_suffix|>\n<|fim_middle|>", "<|vision_start|><|image_pad|><|vision_end|>",
    "<|IM_END|> is not special", "<| im_end |>", "<|endoftext|><|endoftext|><|endoftext|>",
    "a<|im_start|>b<|im_end|>c", "café<|im_end|>\u0301", "<|object_ref_start|>x<|object_ref_end|>",
]

EDGE = [
    "", "a", "A", "'", "''", "'''s", "?", "!!!", "...", "…", "—", "a-b", "a_b", "a/b", "a.b.c",
    "\ufeffBOM at start", "a\ufeffb", " \ufeffc", "\u0085", "a\u0085b", "a \u0085 b", "\x00", "a\x00b",
    "\x07\x1b[31mred\x1b[0m", "\x7f", "\ue000 private use", "\uffff", "\u200d", "a\u200db",
    "\ufe0f", "x\u0301", "\u0301", "\u0301\u0301x", "Hello World", "HELLO WORLD", "hello world",
    "https://example.com/path?query=1&b=two#frag", "user@example.com", "C:\\Windows\\System32",
    "/usr/local/bin/python3", "@mention #hashtag", "snake_case_name camelCaseName PascalCase",
    "SCREAMING_SNAKE", "kebab-case-name", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    "ab" * 500, "The quick brown fox jumps over the lazy dog.", "!@#$%^&*()_+-=[]{}|;:,.<>?/~`",
    "((((()))))", "a (b) [c] {d}", "\"quoted\" 'single' `back`", "« guillemets » „low“ “curly”",
    "it’s curly", "It\u2019S CURLY", "‘single curly’", "¿Qué? ¡Sí!", "x²+y²=z²", "α+β=γ",
    "ÀÁÂÃÄÅ àáâãäå", "ǅungla ǈj ǋ", "ﬁ ﬂ ﬃ ligatures", "Ⓐⓑⓒ", "™ © ®", "°C °F",
    "QmFzZTY0IGVuY29kZWQgc3RyaW5nIHdpdGggcGFkZGluZw==", "a1b2c3d4e5f6", "1a2b3c",
    "\u0041\u030a vs \u00c5 vs \u212b", "\u2126 ohm vs \u03a9 omega", "\u1e9b\u0323",
    "\u0071\u0307\u0323", "\u0e40\u0e01\u0e49\u0e32", "\u1100\u1161\u11a8 jamo", "\u1100\u1161",
    "\uac00\u11a8", "\u0915\u093c", "\u05d0\u05b7", "ſ long s", "'ſ", "Mr. O'Neil's",
    "rock 'n' roll", "'90s", "'tis", "y'all'd've",
]

INVALID_HEX = [
    "ff", "c3", "e282", "f09f98", "eda080", "c080", "61ff62", "f4908080", "e2ffac", "f09f9880e2",
    "48656c6c6fc3", "80808080", "c328", "f0288c28", "fe", "616263f0",
]


def contraction_cases():
    out = []
    for base in CONTRACTION_BASES:
        letters = base[1:]
        variants = {letters, letters.upper(), letters.capitalize()}
        if len(letters) == 2:
            variants.add(letters[0] + letters[1].upper())
        for v in sorted(variants):
            c = "'" + v
            out.append("it" + c)
            out.append("WE" + c + " here")
    out += [
        "I'm sure it's fine, they've said they'll come, we'd've known.",
        "I'M SURE IT'S FINE, THEY'VE SAID THEY'LL COME, WE'D'VE KNOWN.",
        "She'S gone; He'LL see; You'Re right; We'Ve won; I'M in; It'D be; don'T.",
        "'s 't 're 've 'm 'll 'd", "'S 'T 'RE 'VE 'M 'LL 'D", "'sa 'ta 'rea 'll1", "''s",
        "'re'll've", "can't won't shan't ain't", "the dog's bone, the dogs' bones",
        "'Sorry' 'Tis 'Re: subject", " 's", "x's", "1's", "'s1", "\n's", "'\u2019s",
    ]
    return out


def accent_cases():
    out = []
    for w in ACCENT_WORDS:
        nfc = unicodedata.normalize("NFC", w)
        nfd = unicodedata.normalize("NFD", w)
        out.append(nfc)
        if nfd != nfc:
            out.append(nfd)
    out += [
        unicodedata.normalize("NFD", "Thành phố Hồ Chí Minh là thành phố lớn nhất Việt Nam."),
        unicodedata.normalize("NFD", "한국어 텍스트입니다"),
        "e\u0301\u0323 (acute then dot below)", "e\u0323\u0301 (dot below then acute)",
        "a\u0308\u0304", "o\u031b\u0300", "\u00e9\u0323", "A\u030a\u0301",
    ]
    return out


def random_mixes(rng, count):
    pools = [
        "abcdefghijklmnopqrstuvwxyz", "ABCDEFGHIJKLMNOPQRSTUVWXYZ", "0123456789", " " * 6,
        "\n\t\r", ".,;:!?'\"()[]{}<>-_/\\|@#$%^&*+=~`", "éèêëàâäôöûüçñßøåæœ",
        "你好世界中文字符数据", "こんにちはカタカナ", "안녕하세요한국어", "مرحبا", "नमस्ते", "สวัสดี",
        "😀👍🏽❤️🎉🇯🇵", "\u0301\u0308\u0323", "\u00a0\u3000\u2009\ufeff\u0085", "²½Ⅻ١٢",
    ]
    out = []
    for _ in range(count):
        n = rng.randint(1, 60)
        s = []
        for _ in range(n):
            pool = rng.choice(pools)
            k = rng.randint(1, 4)
            s.append("".join(rng.choice(pool) for _ in range(k)))
        text = "".join(s)
        if rng.random() < 0.2:
            text += rng.choice(["<|im_end|>", "<|endoftext|>", "<|im_start|>user\n"])
        out.append(text)
    return out


FUZZ_POOLS = [
    "abcXYZ", "sStTmMdD", "'", "'s", "'S", "'ll", "'LL", "'re", "'Ve", "\u2019", "0123456789",
    " ", "  ", "\t", "\n", "\r", "\r\n", "\u00a0", "\u3000", "\u2009", "\ufeff", "\u0085",
    "\u2028", "\v\f", ".,!?;:-()[]{}<>\"/\\|@#$%^&*_=+~`", "\u0301", "\u0308", "\u0323",
    "\u00e9\u00c5\u00df\u0153", "\u4e2d\u6587", "\u3053\u3093", "\ud55c\uae00",
    "\u1100\u1161\u11a8", "\u0645\u0631", "\u0928\u092e\u0938\u094d", "\u0e2a\u0e27\u0e31",
    "\U0001F600\U0001F44D\U0001F3FD\u200d\u2764\ufe0f", "\u00bd\u00b2\u2167\u0663",
    "\u017f", "<|im_end|>", "<|endoftext|>", "<|im_start|>", "<think>", "<|", "|>",
]


def fuzz_entries(n, seed):
    rng = random.Random(seed)
    entries = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 30)):
            pool = rng.choice(FUZZ_POOLS)
            if len(pool) > 1 and rng.random() < 0.5:
                parts.append(rng.choice(pool))
            else:
                parts.append(pool)
        entries.append({"category": "fuzz", "text": "".join(parts)})
    return entries


def write(entries, path):
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    with open(path, "w", encoding="ascii", newline="\n") as f:
        for i, e in enumerate(entries):
            f.write(json.dumps({"id": i, **e}, ensure_ascii=True) + "\n")
    print("wrote %d strings to %s" % (len(entries), path))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--random", type=int, default=0, help="write N fuzz strings instead")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", default=OUT)
    args = parser.parse_args()
    if args.random:
        write(fuzz_entries(args.random, args.seed), args.out)
        return

    rng = random.Random(20240229)
    entries = []

    def add(category, texts):
        for t in texts:
            entries.append({"category": category, "text": t})

    add("prose", PROSE)
    add("prose", [" ".join(PROSE[i:i + 3]) for i in range(0, len(PROSE), 3)])
    add("code", CODE)
    add("numbers", NUMBERS)
    add("whitespace", WHITESPACE)
    add("scripts", CJK_AND_SCRIPTS)
    add("emoji", EMOJI)
    add("accents", accent_cases())
    add("contractions", contraction_cases())
    add("special", SPECIAL)
    add("edge", EDGE)
    add("mixed", random_mixes(rng, 60))
    for h in INVALID_HEX:
        entries.append({"category": "invalid_utf8", "hex": h})

    write(entries, args.out)


if __name__ == "__main__":
    main()
