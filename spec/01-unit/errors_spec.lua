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
