-- workflow_spec.lua: examples/workflow/run.sh, the policy author's loop
-- (check, test, record, replay, ship, verdicts) against the real binaries
-- on loopback. The script checks each step itself and exits 1 naming the
-- one that misbehaved; this spec runs it and shows its output on failure.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"

describe("examples/workflow/run.sh", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end

  it("goes from a policy file to a spec, a replay and a push with verdicts", function()
    local out, rc = H.sh("sh " .. H.q(here .. "../../examples/workflow/run.sh") .. " " ..
      H.q(H.bin) .. " 2>&1")
    assert.are.equal(0, rc, out)
    -- what each step printed: the spec passed, replay reported moves and
    -- failures, the plane listed the proxy with the applied revision
    assert.is_truthy(out:find("6 successes / 0 failures", 1, true), out)
    -- the 30% edit moves users to v2 and fails none; the bad edit fails some
    assert.is_truthy(out:find("moved, 0 now fail", 1, true), out)
    assert.is_truthy(out:match("moved, [1-9]%d* now fail"), out)
    assert.is_truthy(out:find("30 requests would get another decision", 1, true), out)
    assert.is_truthy(out:find('"id":"proxy-1"', 1, true) or out:find('"id": "proxy-1"', 1, true), out)
    assert.is_truthy(out:find("runs on every proxy", 1, true), out)
  end)
end)
