-- checkout, a bad edit: meant to pin the users outside the canary to the
-- v1 peers, it misspells the metadata key ("verison"), so they get no
-- peer at all. It passes `openmesh check` (its one example covers the
-- canary side only), but `openmesh replay` lists the requests it would
-- fail and exits 1.
local policy = require "openmesh.policy"

local function user(req)
  return policy.header(req, "x-user")
end

return {
  kind = "traffic",
  vary = { "x-user" },
  subset = function(req, peers)
    if policy.unit(user(req) or "") < 0.10 then
      return policy.by(peers, "version", "v2")
    end
    return policy.by(peers, "verison", "v1")
  end,
  key = user,
  examples = {
    { req = { headers = { ["x-user"] = "user-57" } },
      peers = { { id = "v1-a" }, { id = "v2-a", metadata = { version = "v2" } } },
      expect = { "v2-a" } },
  },
}
