-- openmesh.contract: the one definition of what a policy is (its shape per
-- kind) and of what its functions may return (docs/POLICIES.md).
--
-- Everything that decides whether a policy is acceptable, or whether one of
-- its answers is, lives here: `openmesh check`, hot reload, the control
-- plane's config endpoint and openmesh.testing all call this module, inside
-- the policy's own sandbox. So it uses only what the sandbox _ENV offers
-- (base functions, string, table, math; no io, no debug) and never raises on
-- a policy's behalf: policy errors come back as `nil, message`.
--
-- Messages name the field path (`routes[2].name`, `examples[1].peers[3].id`)
-- and never the file: the host prefixes that.
--
-- It is cut in parts, each a module of its own under openmesh/contract/:
-- messages (how values and paths are shown), checkers (field rules),
-- inputs (example requests, peers and contexts), answers (the runtime
-- semantics: subset, key, decide, order, evaluate, ...) and kinds (the examples
-- and the shape of each kind). This file puts the public functions
-- together and validates a policy.
local checks = require("openmesh").checks -- bindings/l_checks.c
local messages = require "openmesh.contract.messages"
local checkers = require "openmesh.contract.checkers"
local inputs = require "openmesh.contract.inputs"
local answers = require "openmesh.contract.answers"
local kinds = require "openmesh.contract.kinds"

local show = messages.show
local one_of = checkers.one_of
local KINDS, KIND_SPECS = kinds.KINDS, kinds.KIND_SPECS

local contract = {}

contract.default_req = inputs.default_req
contract.default_peer = inputs.default_peer
contract.default_ctx = inputs.default_ctx
contract.check_req = inputs.check_req
contract.check_peer = inputs.check_peer
contract.check_ctx = inputs.check_ctx
contract.visible_req = answers.visible_req
contract.subset = answers.subset
contract.key = answers.key
contract.authorize = answers.authorize
contract.decide = answers.decide
contract.order = answers.order
contract.evaluate = answers.evaluate
contract.holding_line = answers.holding_line
contract.handoff = answers.handoff
contract.name = answers.name
contract.settings = answers.settings

-- contract.validate(policy [, file]) -> true | nil, message
-- The shape of the table for its kind (unknown fields, types, ranges,
-- required fields, unique names, compilable patterns), then every example,
-- in order; the first problem found is the message. The file name the
-- host passes is not needed: the host prefixes it to the message itself.
function contract.validate(policy, _file)
  if type(policy) ~= "table" then
    return nil, ("policy: table expected (a policy file returns a table), got %s"):format(show(policy))
  end
  local spec = KIND_SPECS[rawget(policy, "kind")]
  if not spec then
    return nil, one_of(KINDS)(rawget(policy, "kind"), "kind")
  end
  local err = spec.shape(policy, "")
  if err then
    return nil, err
  end
  local examples = rawget(policy, "examples") or {}
  for i = 1, #examples do
    -- A budget that trips inside an example unwinds past this loop: the
    -- host reads which example ran from here to name it in the message.
    rawset(contract, "running_example", i)
    err = spec.run(policy, examples[i])
    if err then
      rawset(contract, "running_example", nil)
      return nil, ("example %d: %s"):format(i, err)
    end
  end
  rawset(contract, "running_example", nil)
  return true
end

-- Exported for openmesh.testing and the specs.
contract.subset_error = answers.subset_error
contract.pattern_error = checks.pattern
contract.literal_prefix = checks.pattern_prefix
contract.pattern_found = answers.pattern_found
contract.show = messages.show
contract.show_list = messages.show_list

return contract
