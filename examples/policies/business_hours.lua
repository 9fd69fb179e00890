-- Business-hours canary: a request that opts in (x-canary: 1) goes to the
-- version=v2 peers, but only from 09:00 to 17:00 UTC, while someone is
-- there to watch it; outside those hours, and for everyone else, only the
-- other peers. The hour comes from os.time(), which is why this policy
-- declares no vary (a policy with vary may not read the clock: its
-- decisions are reused). Tested with a fake clock, in its sandbox:
-- spec/02-policy/testing_helpers_spec.lua.
local policy = require "openmesh.policy"

local OPEN, CLOSE = 9 * 3600, 17 * 3600 -- seconds into the UTC day

local function open_now()
  local s = os.time() % 86400
  return s >= OPEN and s < CLOSE
end

return {
  kind = "traffic",
  description = "x-canary: 1 reaches version=v2 from 09:00 to 17:00 UTC; otherwise the non-v2 peers.",

  subset = function(req, peers)
    if policy.header(req, "x-canary") == "1" and open_now() then
      local v2 = policy.match_metadata(peers, "version", "v2")
      if #v2 > 0 then
        return v2
      end
    end
    return policy.exclude_metadata(peers, "version", "v2")
  end,

  retry_429 = true, -- a throttled peer's 429 is retried on another

  -- Examples run at every load on the real clock: only what holds at any
  -- hour belongs here; the hours themselves are tested with a fake clock.
  examples = {
    { description = "no opt-in: never v2, at any hour",
      peers = { { id = "a", metadata = { version = "v1" } }, { id = "b", metadata = { version = "v2" } } },
      expect = { "a" } },
    { description = "opted in, no v2 registered: the others, at any hour",
      req = { headers = { ["x-canary"] = "1" } },
      peers = { { id = "a", metadata = { version = "v1" } } },
      expect = { "a" } },
  },
}
