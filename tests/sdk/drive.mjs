// tests/sdk/drive.mjs SDK BASE_URL AGENT [MODE]: one call through
// `openmesh egress` with a real SDK, as an application would make it (the
// SDK's default retries left on), for spec/03-integration/sdk_spec.lua.
// SDK: "openai" (the official OpenAI Node SDK, chat completions),
// "anthropic" (@anthropic-ai/sdk, /v1/messages), "vercel" (the Vercel AI
// SDK's generateText/streamText over @ai-sdk/openai's .chat()) or
// "vercel-default" (the same over the provider's default model,
// /v1/responses). MODE: "" (one call), "stream", "stream_usage" (openai:
// with stream_options.include_usage), "tool" (a tool call, then its
// result in a second turn), "image" (openai: image parts, inline and by
// URL). Prints one JSON line: {"ok": true,
// "text", "usage", "answers"} or {"ok": false, "error" (the SDK's error
// class name), "status", "type" (the gateway's error.type), "answers"};
// answers lists each HTTP answer the SDK got: {status, retry_after,
// should_retry}. A fixture, not a test: the spec asserts on what it prints.
import OpenAI from "openai";
import Anthropic from "@anthropic-ai/sdk";
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, streamText, tool, jsonSchema, stepCountIs } from "ai";

const [sdk, baseURL, agent, mode] = process.argv.slice(2);
const headers = { "x-openmesh-agent": agent };
const modelName = process.env.OM_DRIVE_MODEL ?? "any";
const messages = [{ role: "user", content: "Where is my order?" }];

const answers = [];
async function recordingFetch(url, init) {
  const r = await fetch(url, init);
  answers.push({ status: r.status, retry_after: r.headers.get("retry-after") ?? undefined,
                 should_retry: r.headers.get("x-should-retry") ?? undefined });
  return r;
}

function out(v) {
  process.stdout.write(JSON.stringify({ ...v, answers }) + "\n");
}

const lookupTool = {
  name: "lookup_order", description: "Find an order",
  input_schema: { type: "object", properties: { order_id: { type: "integer" } }, required: ["order_id"] },
};

function errorType(e) {
  const body = e.error ?? e.data ?? null;
  if (body && typeof body === "object") return body.type ?? body.error?.type ?? null;
  if (typeof e.responseBody === "string") {
    try { return JSON.parse(e.responseBody).error?.type ?? null; } catch { return null; }
  }
  return null;
}

try {
  if (sdk === "openai") {
    const client = new OpenAI({ baseURL: baseURL + "/v1", apiKey: "sk-gateway", defaultHeaders: headers, fetch: recordingFetch });
    if (mode === "stream" || mode === "stream_usage") {
      const usageOpt = mode === "stream_usage" ? { stream_options: { include_usage: true } } : {};
      const stream = await client.chat.completions.create({ model: modelName, messages, stream: true, ...usageOpt });
      let text = "", usage = null;
      for await (const chunk of stream) {
        text += chunk.choices[0]?.delta?.content ?? "";
        if (chunk.usage) usage = chunk.usage;
      }
      out({ ok: true, text, usage });
    } else if (mode === "tool") {
      // the model's tool call, executed here, then its result in a second turn
      const tools = [{ type: "function", function: { name: lookupTool.name, description: lookupTool.description,
        parameters: lookupTool.input_schema } }];
      const first = await client.chat.completions.create({ model: modelName, messages, tools });
      const calls = first.choices[0].message.tool_calls ?? [];
      if (calls.length === 0) throw new Error("no tool_calls: " + JSON.stringify(first));
      const second = await client.chat.completions.create({
        model: modelName, tools,
        messages: [...messages, first.choices[0].message,
          ...calls.map((c) => ({ role: "tool", tool_call_id: c.id, content: "Order 12 shipped." }))],
      });
      out({ ok: true, text: second.choices[0].message.content, stop_reason: first.choices[0].finish_reason,
            tool: { id: calls[0].id, name: calls[0].function.name, input: JSON.parse(calls[0].function.arguments) } });
    } else if (mode === "image") {
      // a 1x1 PNG, inline, and one by URL
      const png = "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5ErkJggg==";
      const r = await client.chat.completions.create({ model: modelName, messages: [{ role: "user", content: [
        { type: "text", text: "What is in these images?" },
        { type: "image_url", image_url: { url: "data:image/png;base64," + png } },
        { type: "image_url", image_url: { url: "https://example.com/cat.png" } }] }] });
      out({ ok: true, text: r.choices[0].message.content });
    } else {
      const r = await client.chat.completions.create({ model: modelName, messages });
      out({ ok: true, text: r.choices[0].message.content, usage: r.usage ?? null });
    }
  } else if (sdk === "anthropic") {
    const client = new Anthropic({ baseURL, apiKey: "ak-gateway", defaultHeaders: headers, fetch: recordingFetch });
    const textOf = (m) => m.content.filter((b) => b.type === "text").map((b) => b.text).join("");
    if (mode === "stream") {
      const stream = client.messages.stream({ model: modelName, max_tokens: 256, messages });
      let deltas = "";
      stream.on("text", (t) => { deltas += t; });
      const m = await stream.finalMessage();
      out({ ok: true, text: textOf(m), deltas, stop_reason: m.stop_reason, usage: m.usage });
    } else if (mode === "tool") {
      const first = await client.messages.create({ model: modelName, max_tokens: 256, messages, tools: [lookupTool] });
      const uses = first.content.filter((b) => b.type === "tool_use");
      if (uses.length === 0) throw new Error("no tool_use block: " + JSON.stringify(first));
      const second = await client.messages.create({
        model: modelName, max_tokens: 256, tools: [lookupTool],
        messages: [...messages, { role: "assistant", content: first.content },
          { role: "user", content: uses.map((u) => ({ type: "tool_result", tool_use_id: u.id, content: "Order 12 shipped." })) }],
      });
      out({ ok: true, text: textOf(second), stop_reason: first.stop_reason,
            tool: { id: uses[0].id, name: uses[0].name, input: uses[0].input } });
    } else {
      const m = await client.messages.create({ model: modelName, max_tokens: 256, messages });
      out({ ok: true, text: textOf(m), usage: m.usage, stop_reason: m.stop_reason, type: m.type });
    }
  } else if (sdk === "vercel" || sdk === "vercel-default") {
    const provider = createOpenAI({ baseURL: baseURL + "/v1", apiKey: "sk-gateway", headers, fetch: recordingFetch });
    const model = sdk === "vercel" ? provider.chat(modelName) : provider(modelName);
    if (mode === "stream") {
      let failure = null;
      const r = streamText({ model, messages, onError: ({ error }) => { failure = error; } });
      let text = "";
      for await (const t of r.textStream) text += t;
      if (failure) throw failure;
      out({ ok: true, text, usage: (await r.usage) ?? null });
    } else if (mode === "tool") {
      // two steps: the model's tool call, executed here, then its result
      // sent back and the model's answer
      const r = await generateText({
        model, messages, stopWhen: stepCountIs(2),
        tools: { lookup_order: tool({ description: lookupTool.description,
          inputSchema: jsonSchema(lookupTool.input_schema),
          execute: async ({ order_id }) => `Order ${order_id} shipped.` }) },
      });
      const call = r.steps[0]?.toolCalls?.[0] ?? null;
      out({ ok: true, text: r.text, steps: r.steps.length,
            tool: call && { id: call.toolCallId, name: call.toolName, input: call.input } });
    } else {
      const r = await generateText({ model, messages });
      out({ ok: true, text: r.text, usage: r.usage ?? null });
    }
  } else {
    process.stderr.write("usage: drive.mjs openai|anthropic|vercel|vercel-default BASE_URL AGENT [stream|stream_usage|tool|image]\n");
    process.exit(2);
  }
} catch (e) {
  // the Vercel SDK wraps the last error after its retries in RetryError
  const last = e.lastError ?? e;
  out({ ok: false, error: e.constructor?.name ?? "Error", last: last.constructor?.name ?? "Error",
        status: last.status ?? last.statusCode ?? null, type: errorType(last),
        retries: Array.isArray(e.errors) ? e.errors.length : null });
}
