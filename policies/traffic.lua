-- The default traffic policy: every registered peer is eligible, and the
-- proxy's selection does the rest (rendezvous on x-openmesh-key when the
-- request carries one, power of two choices otherwise). No key(): the proxy
-- already reads x-openmesh-key.
--
-- The pool settings are spelled out rather than left to defaults, so an
-- operator reading this file sees the limits a service runs under.
return {
  kind = "traffic",
  description = "All peers; explicit pool limits.",

  subset = function(_, peers)
    return peers
  end,

  -- The decision depends on the peers only: the proxy makes it once per
  -- change of the peers or of this file, not per request.
  vary = {},

  max_inflight = 256, -- concurrent requests to the service from this proxy
  max_queue = 1024, -- requests waiting for a slot (FIFO), beyond: overloaded
  adaptive = false, -- fixed limit; true lets the limiter move below it
  deadline_ms = 10000, -- queueing, attempts and backoffs, up to the response head
  -- per_try_timeout_ms is left out: one attempt may wait for its head as
  -- long as the deadline has left (set it to give up on a slow peer sooner)
  retries = 2, -- extra attempts for safe or idempotent requests
  retry_non_idempotent = false, -- POST without Idempotency-Key: never
  -- pool (upstream keep-alive) is left out on purpose: each peer keeps up
  -- to its share of max_inflight idle (128 with two peers, at least 8),
  -- which follows the view as peers come and go; a fixed
  -- pool = { max_idle_per_peer = N } would not. Idle ones close after
  -- 60 s; no limit on requests per connection.

  examples = {
    { description = "every peer is eligible, zone and metadata ignored",
      req = { method = "POST", path = "/orders", headers = { ["x-user"] = "u1" } },
      peers = { { id = "a", zone = "z1" }, { id = "b", zone = "z2" },
        { id = "c", metadata = { version = "v2" } } },
      expect = { "a", "b", "c" },
      expect_key = false },
    { description = "no peers registered: nothing to choose from",
      peers = {},
      expect = {} },
  },
}
