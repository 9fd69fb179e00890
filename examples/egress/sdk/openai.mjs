// The official OpenAI Node SDK against openmesh egress: a chat completion,
// then a streamed one with its usage. The gateway retries and falls back,
// and its final errors say `x-should-retry`, which this SDK obeys, so the
// SDK's default retries can stay on.
import OpenAI from "openai";

const baseURL = (process.env.OPENMESH_EGRESS_URL ?? "http://127.0.0.1:7700") + "/v1";
const model = process.env.OPENMESH_MODEL ?? "default"; // an alias of fallback.lua
// The gateway holds the provider keys; this one is never forwarded.
const client = new OpenAI({ baseURL, apiKey: "unused" });
const messages = [{ role: "user", content: "Where is my order?" }];

const r = await client.chat.completions.create({ model, messages });
console.log("chat:", r.choices[0].message.content);

const stream = await client.chat.completions.create({
  model, messages, stream: true, stream_options: { include_usage: true },
});
let text = "", usage = null;
for await (const chunk of stream) {
  text += chunk.choices[0]?.delta?.content ?? "";
  usage = chunk.usage ?? usage;
}
console.log("stream:", text, "| tokens:", usage?.prompt_tokens, "+", usage?.completion_tokens);
