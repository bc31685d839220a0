// The HTTP front driven by the official `openai` Node SDK (third_party/npm,
// fetched by scripts/bootstrap.sh): a real cortiq-server on free ports with
// the embedded model, bearer-token auth, and the SDK's own request and
// stream code. Chat and completions, streamed and not; errors surface as
// the SDK's APIError subclasses with their status and param; tools are
// accepted; aborting a stream frees its session (the /metrics gauges come
// back to zero and a cancelled release is counted).
//
// Tool calls and reasoning from a real generation: a second server runs a
// script model (`cortiq-tool mkmodel script`, whose greedy continuation is a
// think block and then a get_weather call) with Qwen3's chat template. The
// SDK must read message.tool_calls (finish_reason "tool_calls", no content)
// whole and as streamed deltas (assembled here and by the SDK's own
// ChatCompletionStream), reasoning_content with thinking on, and the same
// text as plain content when the request gives no tools.
//
// Usage: node openai_sdk_test.mjs --server-bin PATH --tool-bin PATH --workdir DIR
// Exit 0: passed; 1: failed; 77: skipped (the SDK is not installed).
import { spawn, spawnSync } from "node:child_process";
import { existsSync, mkdirSync, createWriteStream } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";
import assert from "node:assert/strict";

const SKIP = 77;
const here = dirname(fileURLToPath(import.meta.url));
const sdkEntry = join(here, "../../third_party/npm/node_modules/openai/index.mjs");
if (!existsSync(sdkEntry)) {
  console.log(`SKIP: the openai SDK is absent (${sdkEntry}); run scripts/bootstrap.sh`);
  process.exit(SKIP);
}
const { default: OpenAI, APIError, NotFoundError, BadRequestError, AuthenticationError } =
  await import(pathToFileURL(sdkEntry).href);

const args = Object.fromEntries(
  process.argv.slice(2).reduce((acc, v, i, all) => (i % 2 ? acc : [...acc, [v.replace(/^--/, ""), all[i + 1]]]), []),
);
assert.ok(args["server-bin"], "--server-bin PATH");
assert.ok(args["tool-bin"], "--tool-bin PATH");
const workdir = args.workdir ?? join(here, "sdk_work");
mkdirSync(workdir, { recursive: true });

const TOKEN = "sdk-test-token-0123456789";
const MODEL = "cortiq-byte-4m";

// The script model: after ChatML's generation prompt its greedy output is
// SCRIPT, then <|im_end|>. Qwen3's template with enable_thinking=false ends
// its prompt in "</think>\n\n", where the script goes on with the call.
const SCRIPT_MODEL = "tool-script";
const REASONING = "The user wants the weather in Paris.";
const CALL_TEXT = '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>';
const SCRIPT = `<think>\n${REASONING}\n</think>\n\n${CALL_TEXT}`;

// Starts a server (the embedded model unless `extra` says) and resolves
// with its process and its HTTP and metrics ports.
function startServer(extra = [], logName = "server.log") {
  const log = createWriteStream(join(workdir, logName));
  const proc = spawn(args["server-bin"], [
    "--listen", "127.0.0.1:0", "--metrics-listen", "127.0.0.1:0", "--http-listen", "127.0.0.1:0",
    "--threads", "1", "--auth-token", TOKEN, "--grace", "0", ...extra,
  ], { stdio: ["ignore", "pipe", "pipe"] });
  proc.stderr.pipe(log);
  return new Promise((resolve, reject) => {
    let out = "";
    const timer = setTimeout(() => reject(new Error(`no ports within 60 s:\n${out}`)), 60_000);
    proc.on("exit", (code) => reject(new Error(`cortiq-server exited ${code}:\n${out}`)));
    proc.stdout.on("data", (d) => {
      out += d;
      log.write(d);
      const m = /^listening on \S+:\d+ metrics (\d+)$/m.exec(out);
      const h = /^http listening on (\S+):(\d+)$/m.exec(out);
      if (m && h) {
        clearTimeout(timer);
        resolve({ proc, metricsPort: Number(m[1]), httpPort: Number(h[2]) });
      }
    });
  });
}

// One gauge or counter from /metrics (summed over its label sets matching `labels`).
async function metric(port, name, labels = "") {
  // A scrape is idempotent: one retried when the kept-alive connection
  // fetch reused was closed by the metrics server meanwhile ("other side
  // closed", seen on a slow, instrumented server).
  let text;
  for (let attempt = 1; ; ++attempt) {
    try {
      text = await (await fetch(`http://127.0.0.1:${port}/metrics`)).text();
      break;
    } catch (e) {
      if (attempt >= 3) throw e;
    }
  }
  let sum = 0;
  for (const line of text.split("\n")) {
    if (!line.startsWith(name)) continue;
    const rest = line.slice(name.length);
    if (!(rest.startsWith(" ") || rest.startsWith("{"))) continue;
    if (labels && !rest.includes(labels)) continue;
    sum += Number(line.trim().split(/\s+/).pop());
  }
  return sum;
}

// Waits (bounded) until `check` holds; the server is another process, so
// its gauges are all there is to watch.
async function waitFor(what, check, ms = 30_000) {
  const until = Date.now() + ms;
  for (;;) {
    if (await check()) return;
    if (Date.now() > until) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 50));
  }
}

async function expectError(promise, Kind, status, param) {
  try {
    await promise;
  } catch (e) {
    assert.ok(e instanceof APIError, `an APIError, got ${e}`);
    assert.ok(e instanceof Kind, `${Kind.name}, got ${e.constructor.name}: ${e.message}`);
    assert.equal(e.status, status);
    if (param !== undefined) assert.equal(e.param, param, e.message);
    return e;
  }
  assert.fail(`expected ${Kind.name}`);
}

// The tool call `stream` (the SDK's chunks) carries: each delta's fields
// assembled per index, as a client does; the content, the reasoning, and
// every finish_reason seen.
async function assembleStream(stream) {
  const calls = [];
  let content = "";
  let reasoning = "";
  const finishes = [];
  let reasoningAfterCall = false;
  for await (const chunk of stream) {
    assert.equal(chunk.object, "chat.completion.chunk");
    for (const c of chunk.choices) {
      content += c.delta?.content ?? "";
      if (c.delta?.reasoning_content) {
        reasoning += c.delta.reasoning_content;
        reasoningAfterCall ||= calls.length > 0;
      }
      for (const d of c.delta?.tool_calls ?? []) {
        const call = (calls[d.index] ??= { id: "", type: "", function: { name: "", arguments: "" } });
        call.id += d.id ?? "";
        call.type += d.type ?? "";
        call.function.name += d.function?.name ?? "";
        call.function.arguments += d.function?.arguments ?? "";
      }
      if (c.finish_reason) finishes.push(c.finish_reason);
    }
  }
  assert.ok(!reasoningAfterCall, "reasoning streamed after the tool call");
  return { calls, content, reasoning, finishes };
}

// The one get_weather call the script model makes.
function assertWeatherCall(calls, where) {
  assert.equal(calls.length, 1, `${where}: one tool call`);
  const [call] = calls;
  assert.match(call.id, /^call_[0-9a-f]{24}$/, `${where}: id`);
  assert.equal(call.type, "function", `${where}: type`);
  assert.equal(call.function.name, "get_weather", `${where}: name`);
  assert.deepEqual(JSON.parse(call.function.arguments), { city: "Paris" }, `${where}: arguments`);
}

// Tool calls and reasoning out of a real generation (see the banner).
async function toolCallChecks(scriptPort) {
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${scriptPort}/v1`, apiKey: TOKEN, maxRetries: 0 });
  const tools = [{
    type: "function",
    function: {
      name: "get_weather", description: "The current weather in a city",
      parameters: { type: "object", properties: { city: { type: "string" } }, required: ["city"] },
    },
  }];
  const messages = [{ role: "user", content: "What is the weather in Paris?" }];
  const noThink = { chat_template_kwargs: { enable_thinking: false } };
  const request = { model: SCRIPT_MODEL, temperature: 0, max_tokens: 100, messages, tools, ...noThink };

  // Whole.
  const whole = await client.chat.completions.create(request);
  const choice = whole.choices[0];
  assert.equal(choice.finish_reason, "tool_calls");
  assert.ok(choice.message.content === null || choice.message.content === "", `content: ${choice.message.content}`);
  assert.equal(choice.message.reasoning_content, undefined);
  assertWeatherCall(choice.message.tool_calls, "whole");
  // The script's tokens, then <|im_end|> (not counted as text).
  assert.ok(whole.usage.completion_tokens > 5 && whole.usage.completion_tokens < 100, `${whole.usage.completion_tokens}`);

  // Streamed: the deltas assemble to the same call; the last chunk finishes it.
  const chunks = [];
  const streamed = await assembleStream((async function* () {
    for await (const chunk of await client.chat.completions.create({ ...request, stream: true })) {
      chunks.push(chunk);
      yield chunk;
    }
  })());
  assertWeatherCall(streamed.calls, "streamed");
  assert.equal(streamed.content, "");
  assert.deepEqual(streamed.finishes, ["tool_calls"]);
  assert.equal(chunks.at(-1).choices[0].finish_reason, "tool_calls");
  assert.equal(streamed.calls[0].function.arguments, choice.message.tool_calls[0].function.arguments);
  // The SDK's own stream assembler agrees.
  const final = await client.chat.completions.stream(request).finalChatCompletion();
  assert.equal(final.choices[0].finish_reason, "tool_calls");
  assertWeatherCall(final.choices[0].message.tool_calls, "ChatCompletionStream");

  // Thinking on (the template's default): the think block is reasoning_content.
  const thinking = { ...request, chat_template_kwargs: undefined };
  const thought = await client.chat.completions.create(thinking);
  assert.equal(thought.choices[0].finish_reason, "tool_calls");
  assert.equal(thought.choices[0].message.reasoning_content?.trim(), REASONING);
  assert.ok(!thought.choices[0].message.content, `content: ${thought.choices[0].message.content}`);
  assertWeatherCall(thought.choices[0].message.tool_calls, "thinking");
  const thoughtStream = await assembleStream(await client.chat.completions.create({ ...thinking, stream: true }));
  assert.equal(thoughtStream.reasoning, thought.choices[0].message.reasoning_content);
  assert.equal(thoughtStream.content, "");
  assert.deepEqual(thoughtStream.finishes, ["tool_calls"]);
  assertWeatherCall(thoughtStream.calls, "thinking, streamed");

  // The call goes back with its result (the template renders both); the
  // script model calls again.
  const call = choice.message.tool_calls[0];
  const again = await client.chat.completions.create({
    ...request,
    messages: [...messages, choice.message, { role: "tool", tool_call_id: call.id, content: '{"celsius": 18}' }],
  });
  assert.equal(again.choices[0].finish_reason, "tool_calls");
  assert.ok(again.usage.prompt_tokens > whole.usage.prompt_tokens);

  // No tools, or tool_choice "none": the same text is plain content.
  const { tools: _, ...plain } = request;
  for (const body of [plain, { ...request, tool_choice: "none" }]) {
    const r = await client.chat.completions.create(body);
    assert.equal(r.choices[0].finish_reason, "stop");
    assert.equal(r.choices[0].message.content, CALL_TEXT);
    assert.equal(r.choices[0].message.tool_calls, undefined);
  }
}

// Writes the script model with the embedded model's tokenizer.
function makeScriptModel() {
  const dir = join(workdir, SCRIPT_MODEL);
  const made = spawnSync(args["tool-bin"], [
    "mkmodel", "script", dir, "--text", SCRIPT, "--tokenizer-from", join(here, "../../models/cortiq-byte-4m"),
  ], { encoding: "utf8" });
  assert.equal(made.status, 0, `cortiq-tool mkmodel script: ${made.stderr}`);
  return dir;
}

const { proc, metricsPort, httpPort } = await startServer();
let scriptServer = null;
let failed = false;
try {
  const client = new OpenAI({ baseURL: `http://127.0.0.1:${httpPort}/v1`, apiKey: TOKEN, maxRetries: 0 });
  const greedy = { model: MODEL, temperature: 0, max_tokens: 12, ignore_eos: true };
  const messages = [
    { role: "system", content: "You are Ahab." },
    { role: "user", content: "Where is the whale?" },
  ];

  // Models.
  const models = await client.models.list();
  assert.deepEqual(models.data.map((m) => m.id), [MODEL]);

  // Chat, whole and streamed (with usage): the same greedy text.
  const chat = await client.chat.completions.create({ ...greedy, messages });
  assert.equal(chat.object, "chat.completion");
  assert.equal(chat.choices[0].message.role, "assistant");
  assert.equal(typeof chat.choices[0].message.content, "string");
  assert.equal(chat.choices[0].finish_reason, "length");
  assert.equal(chat.usage.completion_tokens, 12);
  let streamed = "";
  let usage = null;
  let finish = null;
  const chatStream = await client.chat.completions.create({
    ...greedy, messages, stream: true, stream_options: { include_usage: true },
  });
  for await (const chunk of chatStream) {
    if (chunk.usage) usage = chunk.usage;
    for (const c of chunk.choices) {
      streamed += c.delta?.content ?? "";
      finish = c.finish_reason ?? finish;
    }
  }
  assert.equal(streamed, chat.choices[0].message.content);
  assert.equal(finish, "length");
  assert.equal(usage.completion_tokens, 12);
  assert.equal(usage.prompt_tokens, chat.usage.prompt_tokens);

  // Completions, whole and streamed.
  const prompt = "Call me Ishmael.";
  const cmpl = await client.completions.create({ ...greedy, prompt, logprobs: 2 });
  assert.equal(cmpl.object, "text_completion");
  assert.equal(cmpl.choices[0].logprobs.tokens.length, 12);
  let text = "";
  for await (const chunk of await client.completions.create({ ...greedy, prompt, stream: true })) {
    for (const c of chunk.choices) text += c.text;
  }
  assert.equal(text, cmpl.choices[0].text);

  // Tools are accepted (rendered by the template; the embedded ChatML one ignores them).
  const tools = [{
    type: "function",
    function: { name: "get_weather", description: "The weather", parameters: { type: "object", properties: { city: { type: "string" } } } },
  }];
  const withTools = await client.chat.completions.create({ ...greedy, messages, tools, tool_choice: "auto" });
  assert.equal(withTools.choices.length, 1);
  await expectError(client.chat.completions.create({ ...greedy, messages, tools, tool_choice: "required" }),
    BadRequestError, 400, "tool_choice");

  // Errors as the SDK's classes, with status and param.
  await expectError(client.chat.completions.create({ ...greedy, model: "gpt-4", messages }), NotFoundError, 404, "model");
  await expectError(client.chat.completions.create({ ...greedy, max_tokens: 0, messages }), BadRequestError, 400, "max_tokens");
  await expectError(client.completions.create({ ...greedy, prompt: ["a", "b"] }), BadRequestError, 400, "prompt");
  await expectError(client.chat.completions.create({ ...greedy, messages, response_format: { type: "json_object" } }),
    BadRequestError, 400, "response_format");
  const stranger = new OpenAI({ baseURL: `http://127.0.0.1:${httpPort}/v1`, apiKey: "wrong-token", maxRetries: 0 });
  await expectError(stranger.models.list(), AuthenticationError, 401);

  // Cancellation: abort a long stream after its first chunk; the server
  // cancels the job and frees the one-shot session.
  const cancelledBefore = await metric(metricsPort, "cortiq_session_releases_total", 'reason="cancelled"');
  const long = await client.chat.completions.create({ ...greedy, max_tokens: 1500, messages, stream: true });
  let chunks = 0;
  for await (const chunk of long) {
    if (++chunks === 2) {
      assert.equal(await metric(metricsPort, "cortiq_sessions_active"), 1);
      long.controller.abort();
      break;
    }
  }
  await waitFor("the aborted stream's session to be released", async () =>
    (await metric(metricsPort, "cortiq_sessions_active")) === 0 &&
    (await metric(metricsPort, "cortiq_engine_active_jobs")) === 0);
  assert.equal(await metric(metricsPort, "cortiq_session_releases_total", 'reason="cancelled"'), cancelledBefore + 1);
  // And the server still answers.
  const after = await client.chat.completions.create({ ...greedy, max_tokens: 2, messages });
  assert.equal(after.usage.completion_tokens, 2);

  scriptServer = await startServer(
    ["--model", makeScriptModel(), "--chat-template", join(here, "../chat/data/qwen3_chat_template.jinja")],
    "script_server.log");
  await toolCallChecks(scriptServer.httpPort);
  console.log("openai SDK test: all checks passed");
} catch (e) {
  failed = true;
  console.error("FAILED:", e);
} finally {
  proc.kill("SIGTERM");
  scriptServer?.proc.kill("SIGTERM");
}
process.exit(failed ? 1 : 0);
