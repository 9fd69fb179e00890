-- Canary: 10% of users see the v2 peers, everyone else never does.
--
-- The user is the x-user header, else the `user` cookie. Which users are in
-- the 10% depends only on the user (a hash), so a user stays on one side
-- across requests and proxies; raising PERCENT adds users and removes none.
-- Requests without a user never go to the canary. A canary user while no v2
-- peer is registered goes to the stable peers; a stable user never reaches
-- v2, even when no stable peer is left.
local policy = require "openmesh.policy"

local PERCENT = 10
local CANARY = { version = "v2" } -- metadata every canary peer carries

local function user(req)
  return policy.header(req, "x-user") or policy.cookie(req, "user")
end

return {
  kind = "traffic",
  description = "10% of users (x-user header or user cookie) go to metadata.version = v2.",

  subset = function(req, peers)
    return policy.canary(peers, user(req), PERCENT, CANARY)
  end,

  -- Sticky: each user keeps going to the same peer on its side.
  key = user,

  -- The decision depends on these headers only: the policy sees nothing
  -- else of a request, and the proxy reuses its answer for every request
  -- that carries the same values (no Lua runs for those).
  vary = { "x-user", "cookie" },

  examples = {
    { description = "no user: stable peers only",
      peers = { { id = "v1-a" }, { id = "v2-a", metadata = { version = "v2" } } },
      expect = { "v1-a" }, expect_key = false },
    { description = "a user outside the 10% (by header)",
      req = { headers = { ["x-user"] = "user-1" } },
      peers = { { id = "v1-a" }, { id = "v1-b" }, { id = "v2-a", metadata = { version = "v2" } } },
      expect = { "v1-a", "v1-b" }, expect_key = "user-1" },
    -- user-57 hashes into the 10% (policy.unit("user-57") < 0.10).
    { description = "a user inside the 10% (by cookie)",
      req = { headers = { cookie = "theme=dark; user=user-57" } },
      peers = { { id = "v1-a" }, { id = "v2-a", metadata = { version = "v2" } } },
      expect = { "v2-a" }, expect_key = "user-57" },
    { description = "a stable user never reaches v2, even when v2 is all there is",
      req = { headers = { ["x-user"] = "user-1" } },
      peers = { { id = "v2-a", metadata = { version = "v2" } } },
      expect = {} },
    { description = "a canary user while v2 is not deployed: stable peers",
      req = { headers = { ["x-user"] = "user-57" } },
      peers = { { id = "v1-a" } },
      expect = { "v1-a" } },
  },
}
