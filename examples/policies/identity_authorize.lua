-- Identity authorize: only callers of namespace "a" may call the service.
-- A listener started with --tls-client-ca gives the policy req.identity;
-- authorize runs first, before admission and before key and subset: a
-- caller whose SPIFFE ID is spiffe://mesh/ns/a/... goes on to every peer,
-- any other (another namespace, a certificate without a SPIFFE ID, a
-- plaintext or anonymous caller) gets 403 forbidden with the reason, and
-- no peer sees the call.
--
-- The policy declares vary = { ":identity" }: its decisions depend only on
-- the caller's certificate, so the proxy caches them per identity (subject
-- and SANs) and runs the policy once per caller, not once per request.

-- "spiffe://mesh/ns/a/sa/x" -> "a"
local function namespace(req)
  local id = req.identity
  local spiffe = id and id.spiffe
  return spiffe and spiffe:match("^spiffe://mesh/ns/([^/]+)/")
end

return {
  kind = "traffic",
  description = "Namespace a callers (SPIFFE IDs) only; others are refused with 403.",
  vary = { ":identity" },

  authorize = function(req)
    local ns = namespace(req)
    if ns == "a" then
      return true
    end
    if req.identity == nil then
      return false, "a client certificate is required"
    end
    return false, ("namespace %s may not call %s"):format(ns or "(none)", req.service)
  end,

  subset = function(_req, peers)
    return peers
  end,

  examples = {
    { description = "namespace a: allowed, every peer",
      req = { identity = { uris = { "spiffe://mesh/ns/a/sa/x" } } },
      peers = { { id = "p1" }, { id = "p2" } },
      expect_authorized = true, expect = { "p1", "p2" } },
    { description = "namespace b: refused",
      req = { service = "orders", identity = { uris = { "spiffe://mesh/ns/b/sa/y" } } },
      expect_authorized = false, expect_reason = "namespace b may not call orders" },
    { description = "no SPIFFE ID: refused",
      req = { identity = { subject = "CN=z", dns = { "z.mesh" } } },
      expect_authorized = false, expect_reason = "namespace (none) may not call example" },
    { description = "no certificate: refused",
      expect_authorized = false, expect_reason = "a client certificate is required" },
  },
}
