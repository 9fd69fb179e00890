-- openmesh.contract.inputs: the example inputs (requests, peers, contexts):
-- their shapes and defaults. One part of openmesh.contract (the facade,
-- lua/openmesh/contract.lua, says what the whole does); like it, it uses only
-- what the sandbox _ENV offers.

local messages = require "openmesh.contract.messages"
local checkers = require "openmesh.contract.checkers"

local shallow_copy = messages.shallow_copy
local integer_at_least = checkers.integer_at_least
local number_above = checkers.number_above
local text = checkers.text
local nonempty = checkers.nonempty
local one_of = checkers.one_of
local array_of = checkers.array_of
local map_of = checkers.map_of
local record = checkers.record

local M = {}

---------------------------------------------------------------------------
-- Example inputs: shapes and defaults
---------------------------------------------------------------------------

local function lower_case(name)
  if name:lower() ~= name then
    return "header names must be lower-case"
  end
end

-- The verified client certificate of the caller (nil for a plaintext or
-- anonymous caller): its subject, URI and DNS SANs, and the first URI SAN
-- that is a SPIFFE ID.
local identity_shape = record {
  { "subject", text },
  { "uris", array_of(text) },
  { "dns", array_of(text) },
  { "spiffe", text },
}

-- A gRPC call's service and method (from :path "/pkg.Service/Method").
local grpc_shape = record {
  { "service", nonempty, required = true },
  { "method", nonempty, required = true },
}

local req_shape = record {
  { "service", text },
  { "method", text },
  { "path", text },
  { "headers", map_of(text, lower_case) },
  { "metadata", map_of(text) },
  { "identity", identity_shape },
  { "grpc", grpc_shape },
}

local peer_shape = record {
  { "id", nonempty, required = true },
  { "url", text },
  { "weight", number_above(0) },
  { "zone", text },
  { "metadata", map_of(text) },
}

local failure_shape = record {
  { "route", text },
  { "status", integer_at_least(0) },
  { "class", text },
}

local ctx_shape = record {
  { "agent", text },
  { "context", one_of { "interactive", "async" } },
  { "channel", text },
  -- the caller's model: an alias of the policy's `models`, when it has them
  { "model", text },
  { "failed", array_of(failure_shape) },
  -- what a heuristics check may compare the reply with
  { "system_prompt", text },
  { "question", text },
}

-- An identity as a spec writes it (nil stays nil), as the proxy builds it:
-- uris and dns always present, spiffe the first spiffe:// URI SAN unless
-- given.
local function default_identity(t)
  if t == nil then
    return nil
  end
  local id = {
    subject = t.subject or "",
    uris = shallow_copy(t.uris),
    dns = shallow_copy(t.dns),
    spiffe = t.spiffe,
  }
  if id.spiffe == nil then
    for _, u in ipairs(id.uris) do
      if u:sub(1, 9) == "spiffe://" then
        id.spiffe = u
        break
      end
    end
  end
  return id
end

-- A request as an example or a spec writes it, with the documented
-- defaults filled in. Always a fresh table: policies may mutate theirs.
function M.default_req(t)
  t = t or {}
  return {
    service = t.service or "example",
    method = t.method or "GET",
    path = t.path or "/",
    headers = shallow_copy(t.headers),
    metadata = shallow_copy(t.metadata),
    identity = default_identity(t.identity),
    grpc = t.grpc and { service = t.grpc.service, method = t.grpc.method },
  }
end

-- A peer with the documented defaults filled in (a fresh table).
function M.default_peer(t)
  t = t or {}
  return {
    id = t.id,
    url = t.url or "http://127.0.0.1:1/",
    weight = t.weight or 1,
    zone = t.zone,
    metadata = shallow_copy(t.metadata),
  }
end

-- A fallback / egress context with the defaults examples use.
function M.default_ctx(t)
  t = t or {}
  local failed = {}
  for i, f in ipairs(t.failed or {}) do
    failed[i] = shallow_copy(f)
  end
  return {
    agent = t.agent or "example",
    context = t.context or "interactive",
    channel = t.channel or "example",
    model = t.model, -- nil: the caller named none
    failed = failed,
    system_prompt = t.system_prompt, -- nil: checks that need it pass
    question = t.question,
  }
end

local function default_peers(list)
  local peers = {}
  for i, p in ipairs(list or {}) do
    peers[i] = M.default_peer(p)
  end
  return peers
end

-- Shape checks for the example builders of openmesh.testing (same rules,
-- same messages as inside a policy's examples).
M.check_req = function(t, path)
  return req_shape(t, path or "req")
end
M.check_peer = function(t, path)
  return peer_shape(t, path or "peer")
end
M.check_ctx = function(t, path)
  return ctx_shape(t, path or "ctx")
end

-- What the other parts use.
M.req_shape = req_shape
M.peer_shape = peer_shape
M.ctx_shape = ctx_shape
M.default_peers = default_peers

return M
