-- Metadata match: requests that ask for v2 (header x-version: v2) go only
-- to peers with metadata.version = "v2"; every other request goes only to
-- the other peers. Neither side spills into the other: with no peer of the
-- requested kind the subset is empty and the request fails with no_peers.
local policy = require "openmesh.policy"

return {
  kind = "traffic",
  description = "x-version: v2 selects the v2 peers; everything else the non-v2 peers.",

  subset = function(req, peers)
    if policy.header(req, "x-version") == "v2" then
      return policy.match_metadata(peers, "version", "v2")
    end
    return policy.exclude_metadata(peers, "version", "v2")
  end,

  -- The decision depends on this header only: the proxy reuses it for
  -- every request that carries the same value.
  vary = { "x-version" },

  examples = {
    { description = "asked for v2",
      req = { headers = { ["x-version"] = "v2" } },
      peers = { { id = "a", metadata = { version = "v1" } }, { id = "b", metadata = { version = "v2" } },
        { id = "c", metadata = { version = "v2" } } },
      expect = { "b", "c" } },
    { description = "no header: everything but v2, peers without a version included",
      peers = { { id = "a", metadata = { version = "v1" } }, { id = "b", metadata = { version = "v2" } },
        { id = "c" } },
      expect = { "a", "c" } },
    { description = "another version asked for: not v2",
      req = { headers = { ["x-version"] = "v3" } },
      peers = { { id = "a", metadata = { version = "v1" } }, { id = "b", metadata = { version = "v2" } } },
      expect = { "a" } },
    { description = "asked for v2, none registered: empty, never the others",
      req = { headers = { ["x-version"] = "v2" } },
      peers = { { id = "a", metadata = { version = "v1" } } },
      expect = {} },
  },
}
