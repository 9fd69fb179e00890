// The Vercel AI SDK against openmesh egress: the provider's default path
// (the OpenAI Responses API, POST /v1/responses) and `.chat()` (chat
// completions). This SDK retries 5xx whatever `x-should-retry` says, so
// calls through the gateway set maxRetries: 0: the gateway has retried.
import { createOpenAI } from "@ai-sdk/openai";
import { generateText, streamText } from "ai";

const baseURL = (process.env.OPENMESH_EGRESS_URL ?? "http://127.0.0.1:7700") + "/v1";
const modelName = process.env.OPENMESH_MODEL ?? "default";
const provider = createOpenAI({ baseURL, apiKey: "unused" });
const messages = [{ role: "user", content: "Where is my order?" }];

const a = await generateText({ model: provider(modelName), messages, maxRetries: 0 });
console.log("responses:", a.text);

const b = await generateText({ model: provider.chat(modelName), messages, maxRetries: 0 });
console.log("chat:", b.text);

const s = streamText({ model: provider(modelName), messages, maxRetries: 0 });
let text = "";
for await (const t of s.textStream) text += t;
const usage = await s.usage;
console.log("stream:", text, "| tokens:", usage.inputTokens, "+", usage.outputTokens);
