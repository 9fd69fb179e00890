-- bench/wrk/chat.lua: every request is the chat completion bench/chat_client
-- sends (JSON, not streamed), for bench/egress_gateway_bench.sh.
wrk.method = "POST"
wrk.body = '{"model":"m","messages":[{"role":"system","content":"You are a helpful support agent."},{"role":"user","content":"Where is my order 12?"}]}'
wrk.headers["Content-Type"] = "application/json"
