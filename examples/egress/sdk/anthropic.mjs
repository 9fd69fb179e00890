// The Anthropic TypeScript SDK against openmesh egress (POST /v1/messages):
// a message, then a streamed one. The route that answers may be OpenAI or
// Anthropic: the gateway translates both ways.
import Anthropic from "@anthropic-ai/sdk";

const baseURL = process.env.OPENMESH_EGRESS_URL ?? "http://127.0.0.1:7700";
const model = process.env.OPENMESH_MODEL ?? "default";
const client = new Anthropic({ baseURL, apiKey: "unused" });
const messages = [{ role: "user", content: "Where is my order?" }];
const textOf = (m) => m.content.filter((b) => b.type === "text").map((b) => b.text).join("");

const m = await client.messages.create({ model, max_tokens: 256, messages });
console.log("message:", textOf(m), "| stop:", m.stop_reason);

const stream = client.messages.stream({ model, max_tokens: 256, messages });
const final = await stream.finalMessage();
console.log("stream:", textOf(final), "| tokens:", final.usage.input_tokens, "+", final.usage.output_tokens);
