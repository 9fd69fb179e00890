-- Zone-local: keep a caller's traffic in its own zone (req.metadata.zone)
-- while at least MIN_PEERS peers are there; with fewer, spill over to every
-- zone rather than pile the zone's load on one or two instances. Callers
-- that do not say their zone get every peer.
local policy = require "openmesh.policy"

local MIN_PEERS = 2

return {
  kind = "traffic",
  description = "Prefer peers in the caller's zone; all zones when it has fewer than 2.",

  subset = function(req, peers)
    return policy.zone_local(peers, req.metadata.zone, MIN_PEERS)
  end,

  examples = {
    { description = "two peers in the caller's zone: only those",
      req = { metadata = { zone = "eu-1" } },
      peers = { { id = "a", zone = "eu-1" }, { id = "b", zone = "eu-1" }, { id = "c", zone = "us-1" } },
      expect = { "a", "b" } },
    { description = "one peer in the caller's zone: spill over to all",
      req = { metadata = { zone = "eu-1" } },
      peers = { { id = "a", zone = "eu-1" }, { id = "c", zone = "us-1" }, { id = "d", zone = "us-1" } },
      expect = { "a", "c", "d" } },
    { description = "caller's zone unknown: all peers",
      peers = { { id = "a", zone = "eu-1" }, { id = "c", zone = "us-1" }, { id = "e" } },
      expect = { "a", "c", "e" } },
  },
}
