#!/usr/bin/env python3
"""Writes tests/chat/data/corpus.jsonl: the conversations rendered by both
@huggingface/jinja (tests/chat/render_reference.mjs -> reference.jsonl) and
ChatTemplate (tests/chat/reference_test.cc), which must agree byte for byte.

Deterministic (seeded); run from the repository root:
  python3 tests/chat/make_corpus.py && node tests/chat/render_reference.mjs

Each line: {"id", "template", "category", "messages", "tools",
"add_generation_prompt", "extra"}. template is one of qwen3, qwen2_5,
llama3_2, chatml. The categories cover multi-turn chats with and without a
system message, tool definitions, assistant tool_calls (arguments as objects
and as JSON strings), runs of tool results, reasoning (<think> in content and
reasoning_content), enable_thinking true / false / absent,
add_generation_prompt true / false, Unicode (CJK, emoji, combining marks,
RTL, unusual whitespace), quotes, backslashes and newlines, empty content,
and a few conversations the templates refuse (raise_exception or a type
error), where both sides must fail.
"""
import argparse
import json
import os
import random

TEXTS = [
    "Hello!",
    "What is the capital of France?",
    "Paris is the capital of France.",
    "line one\nline two\n\nline four",
    "  leading and trailing spaces  ",
    "\n\nstarts with newlines",
    "ends with newlines\n\n",
    'She said "hi" and left.',
    "back\\slash C:\\path\\to\\file and \\n literal",
    "tabs\tand\tmore\ttabs",
    "",
    "你好，世界！今天天气怎么样？",
    "日本語のテキストと漢字",
    "한국어 문장입니다",
    "emoji 👍🏽 🎉 👨‍👩‍👧‍👦 ✅",
    "combining: e\u0301 a\u0308 n\u0303 Å",
    "RTL: مرحبا بالعالم و שלום עולם",
    "mixed\u00a0nbsp\u2003em-space\u3000ideographic",
    "line\u2028separator and para\u2029graph",
    "json-looking {\"a\": 1, \"b\": [1, 2]}",
    "{{ not a template }} {% neither %} {# nor #}",
    "<tool_response>looks like a tool response</tool_response>",
    "<|im_start|>fake special<|im_end|>",
    "math: 1 + 1 = 2; 3 * 4 = 12; x^2 ≥ 0",
    "control\u0001char and \u007f delete",
    "a" * 300,
    "Ünïcödé Ελληνικά Кириллица",
    "trailing backslash \\",
]

REASONING = [
    "Let me think step by step.",
    "The user wants X.\nSo I should do Y.",
    "  indented reasoning  ",
    "推理过程：先分析问题。",
    "",
]

TOOLS = [
    {"type": "function", "function": {
        "name": "get_weather",
        "description": "Get the current weather in a given location",
        "parameters": {"type": "object", "properties": {
            "location": {"type": "string", "description": "The city and state, e.g. San Francisco, CA"},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}},
            "required": ["location"]}}},
    {"type": "function", "function": {
        "name": "search",
        "description": "Search the web for \"exact\" phrases\nand return results",
        "parameters": {"type": "object", "properties": {
            "query": {"type": "string"},
            "max_results": {"type": "integer", "minimum": 1, "maximum": 50, "default": 10},
            "filters": {"type": "object", "properties": {"lang": {"type": "string"},
                                                          "safe": {"type": "boolean"}}}},
            "required": ["query"]}}},
    {"type": "function", "function": {
        "name": "翻译",
        "description": "把文本翻译成另一种语言 🌐",
        "parameters": {"type": "object", "properties": {"text": {"type": "string"},
                                                         "target": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "no_params", "description": "",
                                      "parameters": {"type": "object", "properties": {}}}},
]

ARGUMENTS = [
    {"location": "Paris, France"},
    {"location": "東京", "unit": "celsius"},
    {"query": "what's \"new\"\nin C++?", "max_results": 3, "filters": {"lang": "en", "safe": True}},
    {"text": "Hello 👋", "target": "zh"},
    {},
    {"nested": {"list": [1, 2.5, -3, None, True, False], "empty": [], "obj": {}}},
    {"ratio": 0.1, "big": 12345678901234, "neg": -0.5, "exp": 1e-7},
    {"path": "C:\\Users\\me", "tab": "a\tb"},
]

TOOL_RESULTS = [
    "{\"temperature\": 22, \"unit\": \"celsius\"}",
    "Sunny, 22°C",
    "",
    "result with\nnewlines\n",
    "错误：未找到",
    "[1, 2, 3]",
]


def pick(rng, xs):
    return xs[rng.randrange(len(xs))]


def tool_call(rng, as_string, with_id=True):
    fn = pick(rng, TOOLS)["function"]["name"]
    args = pick(rng, ARGUMENTS)
    call = {"type": "function", "function": {"name": fn,
                                             "arguments": json.dumps(args, ensure_ascii=rng.random() < 0.5)
                                             if as_string else args}}
    if with_id:
        call = {"id": "call_%d" % rng.randrange(10000), **call}
    return call


def assistant_text(rng, reasoning_style):
    text = pick(rng, TEXTS)
    if reasoning_style == "think_in_content":
        sep = pick(rng, ["\n\n", "\n", "", "  \n"])
        return {"role": "assistant", "content": "<think>\n%s\n</think>%s%s" % (pick(rng, REASONING), sep, text)}
    if reasoning_style == "reasoning_field":
        return {"role": "assistant", "content": text, "reasoning_content": pick(rng, REASONING)}
    if reasoning_style == "reasoning_null":
        return {"role": "assistant", "content": text, "reasoning_content": None}
    return {"role": "assistant", "content": text}


def conversation(rng, turns, system, tools_style, reasoning_style, args_as_string, template):
    msgs = []
    if system:
        msgs.append({"role": "system", "content": pick(rng, TEXTS[:20]) or "You are helpful."})
    for t in range(turns):
        msgs.append({"role": "user", "content": pick(rng, TEXTS)})
        last = t == turns - 1
        if last and rng.random() < 0.5:
            break  # end on a user turn (the usual generation case)
        if tools_style and rng.random() < 0.6:
            ncalls = 1 if template == "llama3_2" else rng.choice([1, 1, 2, 3])
            content = "" if rng.random() < 0.6 else pick(rng, TEXTS[:10])
            if template == "qwen3" and reasoning_style == "think_in_content" and rng.random() < 0.5:
                content = "<think>\n%s\n</think>\n\n%s" % (pick(rng, REASONING), content)
            msg = {"role": "assistant", "content": content,
                   "tool_calls": [tool_call(rng, args_as_string or rng.random() < 0.3) for _ in range(ncalls)]}
            if template == "qwen3" and reasoning_style == "reasoning_field":
                msg["reasoning_content"] = pick(rng, REASONING)
            msgs.append(msg)
            for _ in range(ncalls):
                msgs.append({"role": "tool", "content": pick(rng, TOOL_RESULTS)})
            if rng.random() < 0.7:
                msgs.append(assistant_text(rng, reasoning_style))
        else:
            msgs.append(assistant_text(rng, reasoning_style))
    return msgs


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="tests/chat/data/corpus.jsonl")
    ap.add_argument("--seed", type=int, default=16)
    args = ap.parse_args()
    rng = random.Random(args.seed)
    cases = []

    def add(template, category, messages, tools=None, agp=True, extra=None):
        cases.append({"id": len(cases), "template": template, "category": category, "messages": messages,
                      "tools": tools, "add_generation_prompt": agp, "extra": extra or {}})

    reasoning_styles = ["none", "think_in_content", "reasoning_field", "reasoning_null"]
    thinking = [None, True, False]
    # Qwen3: the full grid, then random extras.
    for i in range(150):
        system = i % 2 == 0
        tools_style = (i // 2) % 3 == 0
        reasoning = reasoning_styles[(i // 6) % 4]
        enable = thinking[(i // 24) % 3]
        agp = (i // 3) % 2 == 0
        extra = {} if enable is None else {"enable_thinking": enable}
        tools = [pick(rng, TOOLS) for _ in range(rng.choice([1, 2, 4]))] if tools_style else None
        msgs = conversation(rng, rng.choice([1, 2, 3, 5]), system, tools_style, reasoning,
                            args_as_string=(i % 5 == 0), template="qwen3")
        add("qwen3", "grid/sys=%d/tools=%d/%s" % (system, tools_style, reasoning), msgs, tools, agp, extra)
    # Qwen3 edge cases.
    add("qwen3", "edge/single-user", [{"role": "user", "content": "hi"}])
    add("qwen3", "edge/empty-contents", [{"role": "system", "content": ""}, {"role": "user", "content": ""},
                                          {"role": "assistant", "content": ""}, {"role": "user", "content": ""}])
    add("qwen3", "edge/tool-response-user", [
        {"role": "user", "content": "q"}, {"role": "assistant", "content": "a"},
        {"role": "user", "content": "<tool_response>x</tool_response>"}])
    add("qwen3", "edge/tools-first-message-not-system", [{"role": "user", "content": "q"}],
        tools=[TOOLS[0], TOOLS[3]])
    add("qwen3", "edge/system-later", [{"role": "user", "content": "q"}, {"role": "system", "content": "late"},
                                       {"role": "user", "content": "again"}])
    add("qwen3", "edge/many-tool-results", [
        {"role": "user", "content": "do it"},
        {"role": "assistant", "content": "", "tool_calls": [tool_call(rng, False) for _ in range(4)]},
        {"role": "tool", "content": "1"}, {"role": "tool", "content": "2"}, {"role": "tool", "content": "3"},
        {"role": "tool", "content": "4"}, {"role": "assistant", "content": "done"}], tools=TOOLS)
    add("qwen3", "edge/tool-first", [{"role": "tool", "content": "orphan"}, {"role": "user", "content": "q"}])
    add("qwen3", "edge/think-spaces", [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "<think>  r  </think>  \t answer with leading spaces"},
        {"role": "user", "content": "q2"},
        {"role": "assistant", "content": "no think at all </think> but a closing tag"}], agp=False,
        extra={"enable_thinking": True})
    add("qwen3", "edge/tool-call-without-function-wrapper", [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "", "tool_calls": [{"name": "search", "arguments": {"query": "x"}}]}])
    add("qwen3", "error/null-assistant-content", [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [tool_call(rng, False)]}])
    add("qwen3", "error/null-user-content", [{"role": "user", "content": None}])

    # Qwen2.5.
    for i in range(40):
        system = i % 2 == 0
        tools_style = i % 3 == 0
        tools = [pick(rng, TOOLS) for _ in range(rng.choice([1, 3]))] if tools_style else None
        msgs = conversation(rng, rng.choice([1, 2, 4]), system, tools_style, "none", i % 4 == 0, "qwen2_5")
        add("qwen2_5", "grid/sys=%d/tools=%d" % (system, tools_style), msgs, tools, i % 5 != 0)

    # Llama 3.2: tools go in the first user message; one tool call per turn.
    for i in range(40):
        system = i % 2 == 0
        tools_style = i % 3 == 0
        tools = [pick(rng, TOOLS) for _ in range(rng.choice([1, 2]))] if tools_style else None
        msgs = conversation(rng, rng.choice([1, 2, 3]), system, tools_style, "none", False, "llama3_2")
        extra = {}
        if i % 7 == 0:
            extra["date_string"] = "01 Jan 2030"
        if tools_style and i % 2 == 1:
            extra["tools_in_user_message"] = False
        add("llama3_2", "grid/sys=%d/tools=%d" % (system, tools_style), msgs, tools, i % 4 != 0, extra)
    add("llama3_2", "edge/tool-content-object", [
        {"role": "user", "content": "q"},
        {"role": "assistant", "tool_calls": [tool_call(rng, False)]},
        {"role": "tool", "content": {"result": [1, 2], "ok": True}},
        {"role": "ipython", "content": "plain"}], tools=[TOOLS[0]])
    add("llama3_2", "error/two-tool-calls", [
        {"role": "user", "content": "q"},
        {"role": "assistant", "tool_calls": [tool_call(rng, False), tool_call(rng, False)]}], tools=[TOOLS[0]])
    add("llama3_2", "error/tools-without-user", [{"role": "system", "content": "s"}], tools=[TOOLS[1]])

    # ChatML (models without a template of their own).
    for i in range(20):
        msgs = conversation(rng, rng.choice([1, 2, 3]), i % 2 == 0, False, "none", False, "chatml")
        add("chatml", "grid", msgs, None, i % 3 != 0)
    add("chatml", "edge/content-parts", [
        {"role": "user", "content": [{"type": "text", "text": "part one, "}, {"type": "image_url", "image_url": {}},
                                     {"type": "text", "text": "part two"}]},
        {"role": "assistant", "content": None, "tool_calls": [tool_call(rng, False)]},
        {"role": "tool", "content": "r"}])

    os.makedirs(os.path.dirname(args.out), exist_ok=True)
    with open(args.out, "w", encoding="utf-8") as f:
        for c in cases:
            f.write(json.dumps(c, ensure_ascii=False) + "\n")
    print("wrote %d cases to %s" % (len(cases), args.out))


if __name__ == "__main__":
    main()
