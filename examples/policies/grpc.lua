-- gRPC: a service whose peers are gRPC servers (docs/PROXY.md "HTTP/2 to
-- upstreams", "gRPC"). The proxy speaks HTTP/2 to them (prior knowledge
-- to http:// peers, ALPN h2 to https:// ones), relays trailers, passes a
-- caller's grpc-timeout on as what is left of it, and retries a
-- Trailers-Only UNAVAILABLE on another peer (gRPC proposal A6). The
-- policy sees the method as req.grpc.
return {
  kind = "traffic",
  description = "gRPC over HTTP/2; admin methods only from the ops namespace.",

  protocol = "h2c",
  -- the answers worth another peer: the server said it did not process
  -- the call (UNAVAILABLE) or is shedding load (RESOURCE_EXHAUSTED)
  grpc_retry_on = { "UNAVAILABLE", "RESOURCE_EXHAUSTED" },
  retries = 2,
  deadline_ms = 5000, -- up to the response head; a stream lives on after it
  max_deadline_ms = 60000, -- the most a caller's grpc-timeout may ask for
  stream_idle_timeout_ms = 300000, -- a quiet bidi stream may wait 5 min

  authorize = function(req)
    local g = req.grpc
    if g and g.service == "grpc.health.v1.Health" then
      return true -- health checks from anyone
    end
    if g and g.method:match("^Admin") then
      local id = req.identity
      if not (id and id.spiffe and id.spiffe:match("^spiffe://[^/]+/ns/ops/")) then
        return false, "admin methods are for the ops namespace"
      end
    end
    return true
  end,

  subset = function(_, peers)
    return peers
  end,

  examples = {
    { description = "an ordinary method goes to every peer",
      req = { grpc = { service = "shop.Orders", method = "Place" } },
      peers = { { id = "a" }, { id = "b" } },
      expect = { "a", "b" } },
    { description = "an admin method from outside ops is refused",
      req = { grpc = { service = "shop.Orders", method = "AdminPurge" } },
      expect_authorized = false, expect_reason = "admin methods are for the ops namespace" },
    { description = "an admin method from ops passes",
      req = { grpc = { service = "shop.Orders", method = "AdminPurge" },
              identity = { uris = { "spiffe://mesh/ns/ops/sa/tool" } } },
      peers = { { id = "a" } },
      expect_authorized = true, expect = { "a" } },
  },
}
