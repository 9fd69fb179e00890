-- checkout: 10% of users on the v2 peers (by x-user), sticky per user;
-- a POST gets 2 s and a payment is never retried. The policy a team
-- starts from in examples/workflow/README.md.
local policy = require "openmesh.policy"

local PERCENT = 10
local POST = { deadline_ms = 2000 }
local PAYMENT = { deadline_ms = 2000, retries = 0 }

local function user(req)
  return policy.header(req, "x-user")
end

return {
  kind = "traffic",
  deadline_ms = 5000,
  retries = 2,
  vary = { ":method", ":path", "x-user" },

  subset = function(req, peers)
    return policy.canary(peers, user(req), PERCENT, { version = "v2" })
  end,
  key = user,
  decide = function(req)
    if req.method ~= "POST" then
      return nil
    end
    return req.path:find("^/payments") and PAYMENT or POST
  end,

  examples = {
    { req = { headers = { ["x-user"] = "user-57" } },
      peers = { { id = "v1-a" }, { id = "v2-a", metadata = { version = "v2" } } },
      expect = { "v2-a" }, expect_key = "user-57" },
    { req = { method = "POST", path = "/payments/7" },
      expect_decision = { deadline_ms = 2000, retries = 0 } },
  },
}
