// tests/sdk/drive.mjs SDK BASE_URL AGENT [stream]: one chat call through
// `openmesh egress` with a real SDK, as an application would make it (the
// SDK's default retries left on), for spec/03-integration/sdk_spec.lua.
// SDK: "openai" (the official OpenAI Node SDK) or "vercel" (the Vercel AI
// SDK's generateText/streamText over @ai-sdk/openai's .chat()). Prints one
// JSON line: {"ok": true, "text", "usage"} or {"ok": false, "error" (the
// SDK's error class name), "status", "type" (the gateway's error.type)}.
// A fixture, not a test: the spec asserts on what it prints.
import OpenAI from "openai";
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, streamText } from "ai";

const [sdk, baseURL, agent, mode] = process.argv.slice(2);
const headers = { "x-openmesh-agent": agent };
const messages = [{ role: "user", content: "Where is my order?" }];

function out(v) {
  process.stdout.write(JSON.stringify(v) + "\n");
}

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
    const client = new OpenAI({ baseURL: baseURL + "/v1", apiKey: "sk-gateway", defaultHeaders: headers });
    if (mode === "stream") {
      const stream = await client.chat.completions.create({ model: "any", messages, stream: true });
      let text = "";
      for await (const chunk of stream) text += chunk.choices[0]?.delta?.content ?? "";
      out({ ok: true, text });
    } else {
      const r = await client.chat.completions.create({ model: "any", messages });
      out({ ok: true, text: r.choices[0].message.content, usage: r.usage ?? null });
    }
  } else if (sdk === "vercel") {
    const provider = createOpenAI({ baseURL: baseURL + "/v1", apiKey: "sk-gateway", headers });
    if (mode === "stream") {
      let failure = null;
      const r = streamText({ model: provider.chat("any"), messages, onError: ({ error }) => { failure = error; } });
      let text = "";
      for await (const t of r.textStream) text += t;
      if (failure) throw failure;
      out({ ok: true, text });
    } else {
      const r = await generateText({ model: provider.chat("any"), messages });
      out({ ok: true, text: r.text, usage: r.usage ?? null });
    }
  } else {
    process.stderr.write("usage: drive.mjs openai|vercel BASE_URL AGENT [stream]\n");
    process.exit(2);
  }
} catch (e) {
  // the Vercel SDK wraps the last error after its retries in RetryError
  const last = e.lastError ?? e;
  out({ ok: false, error: e.constructor?.name ?? "Error", last: last.constructor?.name ?? "Error",
        status: last.status ?? last.statusCode ?? null, type: errorType(last),
        retries: Array.isArray(e.errors) ? e.errors.length : null });
}
