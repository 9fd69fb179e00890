-- Keyed affinity: requests of one session go to the same peer (rendezvous
-- on the key), so per-session caches stay warm; when that peer leaves, only
-- its sessions move. The session is the x-session header, else the
-- `session` cookie; requests without one are spread by load (P2C).
local policy = require "openmesh.policy"

return {
  kind = "traffic",
  description = "Session affinity on x-session or the session cookie.",

  subset = function(_, peers)
    return peers
  end,

  key = function(req)
    return policy.header(req, "x-session") or policy.cookie(req, "session")
  end,

  -- The decision depends on these headers only: the proxy reuses it for
  -- every request that carries the same values.
  vary = { "x-session", "cookie" },

  examples = {
    { req = { headers = { ["x-session"] = "s-42" } },
      peers = { { id = "a" }, { id = "b" } },
      expect = { "a", "b" }, expect_key = "s-42" },
    { description = "the cookie when there is no header",
      req = { headers = { cookie = "lang=en; session=s-7; theme=dark" } },
      expect_key = "s-7" },
    { description = "the header wins over the cookie",
      req = { headers = { ["x-session"] = "s-1", cookie = "session=s-2" } },
      expect_key = "s-1" },
    { description = "no session: no key",
      req = { headers = { cookie = "lang=en" } },
      expect_key = false },
  },
}
