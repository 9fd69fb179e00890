-- The console (GET /ui) in a real browser: headless Chromium, driven by
-- chromedriver over the WebDriver HTTP API (curl from here), loads the page
-- from a running control plane with tokens; a registration appears, a
-- lease counts down and disappears when it expires, hostile zone, metadata and proxy reports render
-- as text, and a screenshot is written under the build directory.
-- scripts/deps installs chromium and chromium-driver; without them the
-- browser cases are pending, not silently skipped.
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path
local H = require "control_helper"
local cjson = require "cjson"

local CHROMIUM = "/usr/bin/chromium"
local CHROMEDRIVER = "/usr/bin/chromedriver"

local READ = "console-reader-7f3a9c"
local REG = "console-register-51be02"
local ADMIN = "console-admin-c4d9e1"

local function exists(path)
  local f = io.open(path, "r")
  if f then f:close() end
  return f ~= nil
end

local function have_browser()
  return exists(CHROMIUM) and exists(CHROMEDRIVER)
end

-- The page's own bytes and headers, over plain HTTP: no browser needed.
describe("GET /ui", function()
  if not H.bin or H.bin == "" then
    it("serves the console", function() pending("needs OPENMESH_BIN") end)
    return
  end

  local dir, ctl

  setup(function()
    dir = H.tmpdir()
    H.writefile(dir .. "/tokens", READ .. " read\n" .. REG .. " register\n" .. ADMIN .. " admin\n")
    ctl = H.start_control(dir, "--tokens " .. H.q(dir .. "/tokens"))
  end)

  teardown(function()
    if ctl then H.stop(ctl) end
    H.kill_all()
  end)

  it("serves the page, its script and style with a strict CSP and no auth", function()
    local status, body, h = H.request(dir, "GET", ctl.url .. "/ui")
    assert.equal(200, status, body)
    assert.equal("text/html; charset=utf-8", h["content-type"])
    local csp = h["content-security-policy"] or ""
    assert.truthy(csp:find("default-src 'none'", 1, true), csp)
    assert.truthy(csp:find("script-src 'self'", 1, true), csp)
    assert.falsy(csp:find("unsafe", 1, true), csp)
    assert.equal("nosniff", h["x-content-type-options"])
    assert.equal("no-referrer", h["referrer-policy"])
    -- no inline script, nothing from another origin
    for open, inner in body:gmatch("<script([^>]*)>(.-)</script>") do
      assert.truthy(open:find('src="/ui/', 1, true), open)
      assert.equal("", inner)
    end
    assert.falsy(body:find("https?://"), body)
    assert.falsy(body:find(" on%a+="), body) -- no inline event handler
    status, body, h = H.request(dir, "GET", ctl.url .. "/ui/console.js")
    assert.equal(200, status, body)
    assert.equal("text/javascript; charset=utf-8", h["content-type"])
    assert.falsy(body:find("innerHTML", 1, true), "the script must build the DOM from text nodes")
    assert.truthy(h["content-security-policy"])
    status, body, h = H.request(dir, "GET", ctl.url .. "/ui/console.css")
    assert.equal(200, status, body)
    assert.equal("text/css; charset=utf-8", h["content-type"])
    status, _, h = H.request(dir, "HEAD", ctl.url .. "/ui")
    assert.equal(200, status)
    assert.equal("text/html; charset=utf-8", h["content-type"])
  end)

  it("refuses unknown, malformed and oversized file names", function()
    for _, path in ipairs({ "/ui/nope.js", "/ui/..%2fstatus", "/ui/console.js%00",
      "/ui/console.js/x", "/ui/" .. string.rep("a", 4000), "/ui/index.html/" }) do
      local status, body = H.request(dir, "GET", ctl.url .. path)
      assert.equal(404, status, path .. ": " .. body)
      assert.equal("not_found", H.json(body).error, path .. ": " .. body)
    end
    -- a malformed escape is refused before routing, as on every path
    local status, body = H.request(dir, "GET", ctl.url .. "/ui/%zz")
    assert.equal(400, status, body)
    assert.equal("bad_target", H.json(body).error)
    status, body, h = H.request(dir, "POST", ctl.url .. "/ui", { body = "x" })
    assert.equal(405, status, body)
    assert.equal("GET, HEAD, OPTIONS", h["allow"])
  end)

  it("takes ?access_token= for reads only, and never logs it", function()
    local status, body = H.request(dir, "GET", ctl.url .. "/status?access_token=" .. READ)
    assert.equal(200, status, body)
    -- a write cannot be authorized from a URL, whatever the token's roles
    status, body = H.request(dir, "PUT",
      ctl.url .. "/v1/services/web/instances/q?access_token=" .. ADMIN,
      { body = '{"url":"http://127.0.0.1:9","ttl_ms":5000}' })
    assert.equal(401, status, body)
    status, body = H.request(dir, "POST",
      ctl.url .. "/v1/services/web/instances/q/heartbeat?access_token=" .. REG)
    assert.equal(401, status, body)
    -- malformed, oversized, repeated
    for _, q in ipairs({ "access_token=%ff%fe", "access_token=" .. string.rep("x", 5000),
      "access_token=", "access_token=wrong", "access_token=a%20b" }) do
      local s, b, hd = H.request(dir, "GET", ctl.url .. "/v1/services?" .. q)
      assert.equal(401, s, q:sub(1, 40) .. ": " .. b)
      assert.equal("unauthorized", H.json(b).error)
      assert.truthy((hd["www-authenticate"] or ""):find("Bearer", 1, true))
    end
    -- a refused request with the token in its URL is logged by its path
    status = H.request(dir, "GET", ctl.url .. "/v1/nope?access_token=" .. READ)
    assert.equal(404, status)
    local log = H.readfile(ctl.out)
    assert.truthy(log:find('"path":"/v1/nope"', 1, true), log)
    assert.falsy(log:find(READ, 1, true), "the token is in the log")
    assert.falsy(log:find(ADMIN, 1, true), "the token is in the log")
  end)
end)

-- The leases' time left, the one thing the console reads that no snapshot
-- carries: against the memory store and, when there is one, a real Redis.
local R = require "redis_helper"
for _, store in ipairs({ "memory", "redis" }) do
  describe("GET /v1/leases (" .. store .. " store)", function()
    if not H.bin or H.bin == "" or (store == "redis" and not R.available) then
      it("reports each lease's time left", function()
        pending("needs OPENMESH_BIN" .. (store == "redis" and " and redis-server" or ""))
      end)
      return
    end

    local dir, ctl

    setup(function()
      dir = H.tmpdir()
      H.writefile(dir .. "/tokens", READ .. " read\n" .. REG .. " register\n")
      local args = "--tokens " .. H.q(dir .. "/tokens")
      if store == "redis" then
        args = args .. " --store " .. R.start().url .. " --store-prefix console:"
      end
      ctl = H.start_control(dir, args)
    end)

    teardown(function()
      if ctl then H.stop(ctl) end
      H.kill_all()
      if store == "redis" then R.stop_all() end
    end)

    local function leases()
      local status, body = H.request(dir, "GET", ctl.url .. "/v1/leases",
        { headers = { "Authorization: Bearer " .. READ } })
      assert.equal(200, status, body)
      local out = {}
      for _, l in ipairs(H.json(body).leases) do
        out[#out + 1] = l.service .. "/" .. l.id .. "=" .. l.expires_in_ms
      end
      return H.json(body).leases, table.concat(out, " ")
    end

    local function put(svc, id, ttl)
      local status, body = H.request(dir, "PUT", ctl.url .. "/v1/services/" .. svc .. "/instances/" .. id, {
        body = ('{"url":"http://127.0.0.1:9","ttl_ms":%d}'):format(ttl),
        headers = { "Authorization: Bearer " .. REG } })
      assert.equal(200, status, body)
    end

    it("reports each lease's time left, sorted, counting down and renewed", function()
      local l, text = leases()
      assert.equal(0, #l, text)
      put("web", "b", 20000)
      put("web", "a", 10000)
      put("api", "z", 30000)
      put("web-2", "a", 10000)
      l, text = leases()
      assert.equal(4, #l, text)
      assert.same({ "api/z", "web/a", "web/b", "web-2/a" }, {
        l[1].service .. "/" .. l[1].id, l[2].service .. "/" .. l[2].id,
        l[3].service .. "/" .. l[3].id, l[4].service .. "/" .. l[4].id }, text)
      local ttl = { 30000, 10000, 20000, 10000 }
      for i = 1, 4 do
        assert.is_true(l[i].expires_in_ms <= ttl[i] and l[i].expires_in_ms > ttl[i] - 2000, text)
      end
      local before = l[2].expires_in_ms
      H.sleep(0.5)
      l, text = leases()
      local fell = before - l[2].expires_in_ms
      assert.is_true(fell >= 400 and fell < 2000, ("web/a fell by %d ms in 0.5 s: %s"):format(fell, text))
      -- a renewal puts it back at its ttl; a deletion takes it away
      local status, body = H.request(dir, "POST", ctl.url .. "/v1/services/web/instances/a/heartbeat",
        { headers = { "Authorization: Bearer " .. REG } })
      assert.equal(200, status, body)
      l, text = leases()
      assert.is_true(l[2].expires_in_ms > 9000, text)
      status, body = H.request(dir, "DELETE", ctl.url .. "/v1/services/web/instances/b",
        { headers = { "Authorization: Bearer " .. REG } })
      assert.equal(200, status, body)
      l, text = leases()
      assert.equal(3, #l, text)
      assert.falsy(text:find("web/b", 1, true), text)
    end)

    it("needs the read role and takes only GET and HEAD", function()
      local status, body = H.request(dir, "GET", ctl.url .. "/v1/leases")
      assert.equal(401, status, body)
      status, body = H.request(dir, "GET", ctl.url .. "/v1/leases?access_token=" .. READ)
      assert.equal(200, status, body)
      status, body = H.request(dir, "DELETE", ctl.url .. "/v1/leases",
        { headers = { "Authorization: Bearer " .. REG } })
      assert.equal(405, status, body)
      status, body = H.request(dir, "GET", ctl.url .. "/v1/leases/x",
        { headers = { "Authorization: Bearer " .. READ } })
      assert.equal(404, status, body)
    end)
  end)
end

describe("the console in a browser", function()
  if not H.bin or H.bin == "" or not have_browser() then
    it("shows the plane live", function()
      pending("needs OPENMESH_BIN, " .. CHROMIUM .. " and " .. CHROMEDRIVER ..
        " (scripts/deps: chromium chromium-driver)")
    end)
    return
  end

  local dir, ctl, driver, sid

  -- One WebDriver command; its value (fails the spec on an error answer).
  local function wd(method, path, body)
    local status, out = H.request(dir, method, driver.url .. path, {
      body = body, headers = { "Content-Type: application/json" }, max_time = 60 })
    local ok, v = pcall(cjson.decode, out)
    assert(status == 200 and ok, method .. " " .. path .. ": " .. status .. " " .. out)
    return v.value
  end

  -- Run script in the page (a function body; `return` gives the value).
  local function js(script)
    return wd("POST", "/session/" .. sid .. "/execute/sync",
      '{"script":' .. cjson.encode(script) .. ',"args":[]}')
  end

  local function navigate(url)
    wd("POST", "/session/" .. sid .. "/url", cjson.encode({ url = url }))
  end

  -- Poll the page until script returns a truthy value; that value.
  local function wait_js(script, timeout, what)
    local last
    local v = H.wait_for(function()
      last = js(script)
      return last ~= nil and last ~= false and last ~= cjson.null and last
    end, timeout or 5, 0.05)
    assert(v, (what or script) .. ": not within " .. (timeout or 5) .. " s; last: " .. tostring(last))
    return v
  end

  local function register(id, fields)
    local status, body = H.request(dir, "PUT", ctl.url .. "/v1/services/web/instances/" .. id, {
      body = cjson.encode(fields), headers = { "Authorization: Bearer " .. REG } })
    assert.equal(200, status, body)
    return H.json(body)
  end

  setup(function()
    dir = H.tmpdir()
    H.writefile(dir .. "/tokens", READ .. " read\n" .. REG .. " register\n" .. ADMIN .. " admin\n")
    ctl = H.start_control(dir, "--tokens " .. H.q(dir .. "/tokens"))
    driver = H.spawn(H.q(CHROMEDRIVER) .. " --port=0", dir, "chromedriver")
    local port = H.wait_for(function()
      return tonumber(H.readfile(driver.out):match("started successfully on port (%d+)"))
    end, 15)
    assert(port, "chromedriver did not start: " .. H.readfile(driver.out))
    driver.url = "http://127.0.0.1:" .. port
    local caps = {
      capabilities = { alwaysMatch = {
        browserName = "chrome",
        ["goog:chromeOptions"] = {
          binary = CHROMIUM,
          args = { "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            "--no-first-run", "--disable-background-networking", "--disable-component-update",
            "--disable-sync", "--window-size=1280,1100", "--user-data-dir=" .. dir .. "/chromium" },
        },
      } },
    }
    local v = wd("POST", "/session", cjson.encode(caps))
    sid = v.sessionId
    assert(sid, "no WebDriver session")
  end)

  teardown(function()
    if sid then pcall(wd, "DELETE", "/session/" .. sid) end
    if ctl then H.stop(ctl) end
    H.kill_all()
  end)

  it("asks for a token when the URL has none, and connects with the one typed", function()
    navigate(ctl.url .. "/ui")
    wait_js([[var f = document.getElementById("login");
      return f && !f.hidden && document.getElementById("main").hidden &&
        document.getElementById("login-why").textContent]], 10, "the token form")
    local el = wd("POST", "/session/" .. sid .. "/element",
      cjson.encode({ using = "css selector", value = "#token" }))
    local id = el["element-6066-11e4-a52e-4f735466cecf"]
    assert(id, "no element id in " .. cjson.encode(el))
    wd("POST", "/session/" .. sid .. "/element/" .. id .. "/value", cjson.encode({ text = READ }))
    el = wd("POST", "/session/" .. sid .. "/element",
      cjson.encode({ using = "css selector", value = "#login button" }))
    wd("POST", "/session/" .. sid .. "/element/" .. el["element-6066-11e4-a52e-4f735466cecf"] .. "/click", "{}")
    local stream = wait_js([[return !document.getElementById("main").hidden &&
      document.getElementById("stream").dataset.state === "live" && "live"]], 10, "a live stream")
    assert.equal("live", stream)
  end)

  it("says so when the token is refused", function()
    js([[sessionStorage.clear(); return 1]])
    navigate(ctl.url .. "/ui?access_token=not-a-token")
    local why = wait_js([[var f = document.getElementById("login");
      return !f.hidden && document.getElementById("login-why").textContent]], 10, "the refusal")
    assert.equal("The token was refused.", why)
  end)

  it("shows a registration within a second and drops an expired lease", function()
    navigate(ctl.url .. "/ui?access_token=" .. READ)
    wait_js([[return document.getElementById("stream").dataset.state === "live"]], 10, "a live stream")
    -- the token left the address bar
    local href = js([[return location.href]])
    assert.equal(ctl.url .. "/ui", href)
    local t0 = H.now()
    register("a", { url = "http://127.0.0.1:9101", ttl_ms = 60000, zone = "eu-1",
      metadata = { version = "v2" } })
    local cells = wait_js([[var r = document.querySelector('[data-instance="web/a"]');
      return r && Array.from(r.cells).map(function (c) { return c.textContent; })]], 3,
      "instance web/a on the page")
    local took = H.now() - t0
    assert.is_true(took < 1.0, ("the registration showed after %.3f s"):format(took))
    assert.equal("a", cells[1])
    assert.equal("http://127.0.0.1:9101", cells[2])
    assert.equal("eu-1", cells[3])
    assert.equal("version=v2", cells[5])
    -- its lease counts down between the plane's answers, out of its ttl
    local left1 = tonumber(wait_js([[var c = document.querySelector('[data-instance="web/a"] .lease');
      return c && c.getAttribute("data-left-ms")]], 3, "the lease's time left"))
    H.sleep(0.6)
    local lease = js([[var c = document.querySelector('[data-instance="web/a"] .lease');
      return [c.getAttribute("data-left-ms"), c.textContent] ]])
    local left2 = tonumber(lease[1])
    assert.is_true(left1 <= 60000 and left1 > 55000, "left " .. tostring(left1))
    assert.is_true(left1 - left2 >= 300 and left1 - left2 < 2000,
      ("lease left %s then %s 0.6 s later"):format(left1, left2))
    assert.truthy(lease[2]:find(" left of 60 s", 1, true), lease[2])
    -- a lease of 1 s, never renewed: gone from the page after it expires
    local rev = register("b", { url = "http://127.0.0.1:9102", ttl_ms = 1000 }).revision
    wait_js([[return !!document.querySelector('[data-instance="web/b"]')]], 3, "instance web/b")
    t0 = H.now()
    wait_js([[return !document.querySelector('[data-instance="web/b"]') &&
      !!document.querySelector('[data-instance="web/a"]')]], 5, "web/b gone, web/a kept")
    local gone = H.now() - t0
    assert.is_true(gone < 3.0, ("web/b left the page %.3f s after showing"):format(gone))
    local head = js([[return document.querySelector('[data-service="web"] h3').textContent]])
    local shown = tonumber(head:match("revision (%d+)"))
    assert.is_true(shown > rev, ("revision shown %s, registration's %s"):format(head, H.rev(rev)))
    -- the plane's own state, from /status and /readyz
    local plane = wait_js([[var t = document.getElementById("plane").textContent;
      return t.indexOf("expiries") >= 0 && t]], 3, "the plane's state")
    assert.truthy(plane:find("storememory", 1, true), plane)
    assert.truthy(plane:find("readyyes", 1, true), plane)
    assert.truthy(plane:find("staleno", 1, true), plane)
  end)

  it("renders hostile names, metadata and proxy reports as text", function()
    local evil = "<img src=x onerror=window.__pwned=1>"
    local evil_addr = "<img/src=x/onerror=window.__pwned=5>" -- visible ASCII only
    -- a service name cannot carry markup at all: the plane refuses it
    local status, body = H.request(dir, "PUT",
      ctl.url .. "/v1/services/%3Cimg%20src%3Dx%20onerror%3Dalert(1)%3E/instances/a", {
        body = '{"url":"http://127.0.0.1:9","ttl_ms":5000}',
        headers = { "Authorization: Bearer " .. REG } })
    assert.equal(400, status, body)
    assert.equal("service", H.json(body).field)
    register("evil", { url = "http://127.0.0.1:9103", ttl_ms = 60000, zone = evil,
      metadata = { [evil] = "<script>window.__pwned=2</script>", note = "</td><b>bold</b>" } })
    -- a config document and two proxies' verdicts, one with markup
    status, body = H.request(dir, "PUT", ctl.url .. "/v1/config/traffic", {
      body = '{"routes":[]}', headers = { "Authorization: Bearer " .. ADMIN } })
    assert.equal(200, status, body)
    local drev = H.json(body).revision
    status, body = H.request(dir, "POST", ctl.url .. "/v1/config/traffic/status", {
      -- revisions as exact integers (cjson would write 1.79...e+15)
      body = ('{"id":%s,"address":%s,"applied":%s,"refused":%s,"reason":%s}'):format(
        cjson.encode("<img/src=x/onerror=window.__pwned=3>"), cjson.encode(evil_addr), H.rev(drev),
        H.rev(drev + 1), cjson.encode("<script>window.__pwned=4</script>")),
      headers = { "Authorization: Bearer " .. REG } })
    assert.equal(200, status, body)
    status, body = H.request(dir, "POST", ctl.url .. "/v1/config/traffic/status", {
      body = ('{"id":"pa","address":"http://127.0.0.1:7601","applied":%s}'):format(H.rev(drev)),
      headers = { "Authorization: Bearer " .. REG } })
    assert.equal(200, status, body)
    local cells = wait_js([[var r = document.querySelector('[data-instance="web/evil"]');
      return r && Array.from(r.cells).map(function (c) { return c.textContent; })]], 3,
      "instance web/evil")
    assert.equal(evil, cells[3])
    assert.truthy(cells[5]:find(evil .. "=<script>window.__pwned=2</script>", 1, true), cells[5])
    assert.truthy(cells[5]:find("note=</td><b>bold</b>", 1, true), cells[5])
    local proxy = wait_js([[var r = document.querySelector(
        '[data-proxy="traffic/<img/src=x/onerror=window.__pwned=3>"]');
      return r && Array.from(r.cells).map(function (c) { return c.textContent; })]], 3,
      "the hostile proxy's report")
    assert.equal("<img/src=x/onerror=window.__pwned=3>", proxy[1])
    assert.equal(evil_addr, proxy[2])
    assert.equal(H.rev(drev) .. " (current)", proxy[3])
    assert.equal(H.rev(drev + 1), proxy[4])
    assert.equal("<script>window.__pwned=4</script>", proxy[5])
    local pa = wait_js([[var r = document.querySelector('[data-proxy="traffic/pa"]');
      return r && Array.from(r.cells).map(function (c) { return c.textContent; })]], 3, "proxy pa")
    assert.equal(H.rev(drev) .. " (current)", pa[3])
    assert.equal("", pa[4])
    -- nothing became markup, and nothing ran
    local dom = js([[return { imgs: document.images.length, scripts: document.scripts.length,
      bold: document.getElementsByTagName("b").length, pwned: String(window.__pwned) }]])
    assert.same({ imgs = 0, scripts = 1, bold = 0, pwned = "undefined" }, dom)
  end)

  it("takes a screenshot", function()
    wait_js([[return !!document.querySelector('[data-proxy="traffic/pa"]')]], 3, "the page")
    local png64 = wd("GET", "/session/" .. sid .. "/screenshot")
    local build = H.bin:match("^(.*)/bin/[^/]*$") or dir
    local path = build .. "/console_spec.png"
    H.writefile(dir .. "/shot.b64", png64)
    local _, rc = H.sh("base64 -d " .. H.q(dir .. "/shot.b64") .. " > " .. H.q(path))
    assert.equal(0, rc)
    local png = H.readfile(path)
    assert.equal("\137PNG\r\n\26\n", png:sub(1, 8))
    assert.is_true(#png > 10000, ("the screenshot is %d bytes"):format(#png))
  end)

  it("asks for a token again when its token is revoked", function()
    navigate(ctl.url .. "/ui?access_token=" .. READ)
    wait_js([[return document.getElementById("stream").dataset.state === "live"]], 10, "a live stream")
    H.writefile(dir .. "/tokens", REG .. " register\n" .. ADMIN .. " admin\n")
    H.kill(ctl.pid, "HUP")
    local why = wait_js([[var f = document.getElementById("login");
      return !f.hidden && document.getElementById("main").hidden &&
        document.getElementById("login-why").textContent]], 5, "the token form after the reload")
    -- the stream's revoked event or a poll's 401, whichever came first
    assert.truthy(why == "The token of this stream was revoked." or why == "The token was refused.", why)
    assert.equal("unauthorized", js([[return document.getElementById("stream").dataset.state]]))
    H.writefile(dir .. "/tokens", READ .. " read\n" .. REG .. " register\n" .. ADMIN .. " admin\n")
    H.kill(ctl.pid, "HUP")
    assert.truthy(H.wait_for(function()
      return H.readfile(ctl.out):find('"event":"auth_reloaded".*"event":"auth_reloaded"')
    end, 5), "no second auth_reloaded: " .. H.readfile(ctl.out))
  end)

  it("shows a stale store and a plane that went away", function()
    if not R.available then
      pending("needs redis-server")
      return
    end
    local redis = R.start()
    local rp = H.start_control(dir, "--tokens " .. H.q(dir .. "/tokens") .. " --store " ..
      redis.url .. " --store-prefix console-ui:")
    navigate(rp.url .. "/ui?access_token=" .. READ)
    wait_js([[var t = document.getElementById("plane").textContent;
      return t.indexOf("storeredis") >= 0 && t.indexOf("staleno") >= 0 && t.indexOf("readyyes") >= 0]],
      10, "a ready plane on redis")
    R.stop(redis)
    local plane = wait_js([[var t = document.getElementById("plane").textContent;
      return t.indexOf("staleyes") >= 0 && t]], 10, "the plane marked stale")
    assert.truthy(plane:find("readyno (store_unreachable)", 1, true), plane)
    H.kill(rp.pid, "KILL")
    plane = wait_js([[var t = document.getElementById("plane").textContent;
      return t.indexOf("unreachable:") >= 0 &&
        document.getElementById("stream").dataset.state !== "live" && t]], 10, "the plane gone")
    assert.truthy(plane:find("planeunreachable", 1, true), plane)
    R.stop_all()
  end)
end)
