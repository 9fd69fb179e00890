-- Per-request decisions: the canary of canary.lua, and per request what
-- the service's fields only say for all requests. A POST gets a tighter
-- deadline and no retry of its own; a payment is never retried; a stream
-- under /events may stay idle for 10 minutes; every request loses the
-- caller's Cookie and carries the tenant as X-Tenant.
--
-- The service's fields are the defaults and the ceilings: a decision's
-- deadline is capped at max_deadline_ms, and a caller's
-- x-openmesh-deadline-ms may shorten the decision's deadline, never raise
-- it. See docs/POLICIES.md "Per-request decisions".
local policy = require "openmesh.policy"

local function user(req)
  return policy.header(req, "x-user")
end

return {
  kind = "traffic",
  description = "canary by user; POST 2 s, payments never retried, /events streams idle 10 min.",

  deadline_ms = 5000,
  max_deadline_ms = 30000,
  retries = 2,

  subset = function(req, peers)
    return policy.canary(peers, user(req), 10, { version = "v2" })
  end,
  key = user,

  decide = function(req)
    local d = { headers = { cookie = false, ["x-tenant"] = req.headers["x-tenant"] or "public" } }
    if req.method == "POST" then
      d.deadline_ms = 2000
    end
    if req.path:find("^/payments") then
      d.retries = 0
    elseif req.path:find("^/events") then
      d.stream_idle_timeout_ms = 600000
    end
    return d
  end,

  -- decide reads these too: the proxy caches the whole decision per
  -- distinct value of them
  vary = { ":method", ":path", "x-user", "x-tenant" },

  examples = {
    { description = "a POST to /payments: 2 s, never retried",
      req = { method = "POST", path = "/payments/42", headers = { ["x-tenant"] = "acme" } },
      expect_decision = { deadline_ms = 2000, retries = 0, headers = { cookie = false, ["x-tenant"] = "acme" } } },
    { description = "a GET of the event stream: long idle streams",
      req = { path = "/events" },
      expect_decision = { stream_idle_timeout_ms = 600000, headers = { cookie = false, ["x-tenant"] = "public" } } },
    { description = "the canary still applies",
      req = { headers = { ["x-user"] = "user-57" } },
      peers = { { id = "v1-a" }, { id = "v2-a", metadata = { version = "v2" } } },
      expect = { "v2-a" }, expect_key = "user-57" },
  },
}
