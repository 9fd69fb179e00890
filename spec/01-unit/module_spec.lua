local om = require "openmesh"

describe("openmesh module", function()
  it("has a version", function()
    assert.equal("0.1.0", om.version)
  end)

  it("exports the error map both ways", function()
    assert.is_number(om.errors.EINVAL)
    assert.equal("EINVAL", om.errors[om.errors.EINVAL])
    assert.equal("ENOPEERS", om.errors[om.errors.ENOPEERS])
    assert.equal("deadline exceeded", om.strerror(om.errors.EDEADLINE))
  end)
end)

describe("om.select_metadata", function()
  local peers = {
    { id = "a", metadata = { version = "v2", tier = "gold" } },
    { id = "b", metadata = { version = "v1" } },
    { id = "c" },
    { id = "d", metadata = { version = "v2" } },
  }
  local function ids(list)
    local out = {}
    for i, p in ipairs(list) do out[i] = p.id end
    return out
  end

  it("keeps the peers whose metadata has every pair, in order, same tables", function()
    local got = om.select_metadata(peers, { version = "v2" }, true)
    assert.same({ "a", "d" }, ids(got))
    assert.equal(peers[1], got[1])
    assert.same({ "a" }, ids(om.select_metadata(peers, { version = "v2", tier = "gold" }, true)))
  end)

  it("returns the complement with keep = false", function()
    assert.same({ "b", "c" }, ids(om.select_metadata(peers, { version = "v2" }, false)))
  end)

  it("treats an empty match as matching everyone, even peers without metadata", function()
    assert.same({ "a", "b", "c", "d" }, ids(om.select_metadata(peers, {}, true)))
    assert.same({}, om.select_metadata(peers, {}, false))
  end)

  it("rejects a match that is not a string map, and non-table peers", function()
    assert.has_error(function() om.select_metadata(peers, { [1] = "x" }, true) end)
    assert.has_error(function() om.select_metadata(peers, { version = 2 }, true) end)
    assert.has_error(function() om.select_metadata({ "a" }, { version = "v2" }, true) end,
      "peers[1]: table expected")
  end)
end)

describe("om.new_array", function()
  it("gives an empty table and refuses absurd sizes", function()
    local t = om.new_array(16)
    assert.same({}, t)
    t[1] = "x"
    assert.equal(1, #t)
    assert.has_error(function() om.new_array(-1) end)
    assert.has_error(function() om.new_array(1e9) end)
  end)
end)
