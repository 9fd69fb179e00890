-- A browser's EventSource against the control plane's watch: headless
-- Chromium loads a page that opens an EventSource on
-- /v1/watch/services/web, and the first `snapshot` event it receives is
-- written into the page. scripts/deps installs Chromium; without
-- /usr/bin/chromium the spec is pending, not silently skipped.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path
local H = require "control_helper"

local CHROMIUM = "/usr/bin/chromium"

local function have_chromium()
  local f = io.open(CHROMIUM, "r")
  if f then f:close() end
  return f ~= nil
end

describe("a browser EventSource", function()
  if not H.bin or H.bin == "" or not have_chromium() then
    it("receives snapshots", function()
      pending("needs OPENMESH_BIN and " .. CHROMIUM .. " (apt-get install chromium)")
    end)
    return
  end

  local dir, ctl

  setup(function()
    dir = H.tmpdir()
    ctl = H.start_control(dir, "--cors-origin '*'")
  end)

  teardown(function()
    if ctl then H.stop(ctl) end
    H.kill_all()
  end)

  it("receives the snapshot event with its id", function()
    local status, body = H.request(dir, "PUT", ctl.url .. "/v1/services/web/instances/a",
      { body = '{"url": "http://127.0.0.1:9999", "ttl_ms": 60000}' })
    assert.equal(200, status, body)
    local rev = H.json(body).revision
    H.writefile(dir .. "/es.html", ([[
<html><body><pre id="out">waiting</pre><script>
var es = new EventSource("%s/v1/watch/services/web");
es.addEventListener("snapshot", function (e) {
  var s = JSON.parse(e.data);
  es.close();
  document.getElementById("out").textContent =
    "got " + s.service + " id=" + e.lastEventId + " n=" + s.instances.length;
});
es.onerror = function () { document.getElementById("out").textContent += " error"; };
</script></body></html>]]):format(ctl.url))
    local out = H.sh("timeout 60 " .. CHROMIUM .. " --headless=new --no-sandbox --disable-gpu" ..
      " --disable-quic --no-first-run --disable-background-networking" ..
      " --disable-component-update --disable-sync --user-data-dir=" .. H.q(dir .. "/chromium") ..
      " --virtual-time-budget=5000 --dump-dom file://" .. H.q(dir .. "/es.html") .. " 2>/dev/null")
    local got = out:match('<pre id="out">([^<]*)')
    assert.equal(("got web id=%.0f n=1"):format(rev), got)
  end)
end)
