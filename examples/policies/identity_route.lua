-- Identity route: the caller's verified client certificate decides. A
-- listener started with --tls-client-ca gives the policy req.identity
-- (subject, uris, dns, and spiffe: the first spiffe:// URI SAN); a caller
-- of namespace "a" (spiffe://mesh/ns/a/...) goes only to the peers whose
-- metadata group is "a", one of namespace "b" only to group "b", and any
-- other caller (another namespace, a certificate without a SPIFFE ID, a
-- plaintext or anonymous caller: identity nil) to none (no_peers). To
-- refuse a caller with 403 instead, see identity_authorize.lua.
local policy = require "openmesh.policy"

-- "spiffe://mesh/ns/a/sa/x" -> "a"
local function namespace(req)
  local id = req.identity
  local spiffe = id and id.spiffe
  return spiffe and spiffe:match("^spiffe://mesh/ns/([^/]+)/")
end

return {
  kind = "traffic",
  description = "Namespace a and b callers (SPIFFE IDs) to their own peer groups; others to none.",

  -- No vary: the decision depends on the caller's identity, which is
  -- per connection (a policy that declares vary sees it only when its
  -- vary names ":identity"; examples/policies/identity_authorize.lua).
  subset = function(req, peers)
    local ns = namespace(req)
    if ns ~= "a" and ns ~= "b" then
      return {}
    end
    return policy.match_metadata(peers, "group", ns)
  end,

  examples = {
    { description = "namespace a: group a only",
      req = { identity = { uris = { "spiffe://mesh/ns/a/sa/x" } } },
      peers = { { id = "a1", metadata = { group = "a" } }, { id = "b1", metadata = { group = "b" } } },
      expect = { "a1" } },
    { description = "namespace b: group b only",
      req = { identity = { subject = "CN=y", uris = { "spiffe://mesh/ns/b/sa/y" } } },
      peers = { { id = "a1", metadata = { group = "a" } }, { id = "b1", metadata = { group = "b" } } },
      expect = { "b1" } },
    { description = "no identity (plaintext or anonymous): none",
      peers = { { id = "a1", metadata = { group = "a" } } },
      expect = {} },
    { description = "another namespace: none",
      req = { identity = { uris = { "spiffe://mesh/ns/c/sa/z" }, dns = { "c.mesh" } } },
      peers = { { id = "a1", metadata = { group = "a" } } },
      expect = {} },
  },
}
