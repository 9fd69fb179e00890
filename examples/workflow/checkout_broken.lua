-- checkout, a bad edit: meant to keep the canary's users off a v1 peer
-- being drained, it drops every stable peer for everyone else. It passes
-- `openmesh check` (its examples only cover the canary) but `openmesh
-- replay` shows the requests it would fail.
local policy = require "openmesh.policy"

local function user(req)
  return policy.header(req, "x-user")
end

return {
  kind = "traffic",
  vary = { "x-user" },
  subset = function(req, peers)
    return policy.by(peers, "version", "v2")
  end,
  key = user,
  examples = {
    { req = { headers = { ["x-user"] = "user-57" } },
      peers = { { id = "v1-a" }, { id = "v2-a", metadata = { version = "v2" } } },
      expect = { "v2-a" } },
  },
}
