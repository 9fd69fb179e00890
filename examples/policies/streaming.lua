-- Streaming: a service that answers with long streams (Server-Sent Events,
-- LLM token streams, large downloads, uploads, WebSocket). The deadline covers only the wait
-- for the response head; once the head is relayed the stream lives as long
-- as it flows, bounded by the stream timeouts below (docs/PROXY.md
-- "Timeouts").
return {
  kind = "traffic",
  description = "All peers; the head within 5 s, streams while they flow.",

  subset = function(_, peers)
    return peers
  end,
  vary = {}, -- one decision per peer view

  deadline_ms = 5000, -- queueing, attempts and backoffs, up to the head
  max_deadline_ms = 20000, -- a caller's x-openmesh-deadline-ms may ask for more
  -- the upstream sends an SSE comment (": ping") every 15 s: two missed
  -- heartbeats end a dead stream
  stream_idle_timeout_ms = 30000,
  max_stream_ms = 3600000, -- no stream holds a slot beyond an hour
  -- uploads stream through as they arrive: at most 64 MiB, a client that
  -- stalls 30 s gets 408, and bodies up to 1 MiB are kept for a retry
  max_body_bytes = 67108864,
  body_idle_timeout_ms = 30000,
  replay_limit = 1048576,
  upgrades = { "websocket" }, -- WebSocket too (the default, said here)

  examples = {
    { description = "every peer is eligible",
      peers = { { id = "a" }, { id = "b" } },
      expect = { "a", "b" } },
  },
}
