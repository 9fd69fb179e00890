-- control_spec.lua: the real `openmesh control` binary as a child process,
-- driven with curl over loopback (spec/support/control_helper.lua). Every
-- process a test starts is killed in its finally; every curl has --max-time
-- and runs under timeout(1).
--
-- One suite, run once per store: memory, and redis (a redis-server of its
-- own, spec/support/redis_helper.lua; each test gets its own key prefix so
-- tests do not see each other's services).
local here = debug.getinfo(1, "S").source:match("^@(.*/)") or "./"
package.path = here .. "../support/?.lua;" .. package.path

local H = require "control_helper"
local R = require "redis_helper"
local cjson = require "cjson"

local POLICY = [[
return {
  kind = "traffic",
  subset = function(_, peers) return peers end,
  examples = {{ peers = {{id = "a"}}, expect = {"a"} }},
}
]]

local function inst(url, ttl_ms, extra)
  local t = { url = url, ttl_ms = ttl_ms or 10000 }
  for k, v in pairs(extra or {}) do
    t[k] = v
  end
  return t
end

local function ids_of(snapshot)
  local ids = {}
  for _, i in ipairs(snapshot.instances) do
    ids[#ids + 1] = i.id
  end
  return ids
end

for _, store in ipairs { "memory", "redis" } do
describe("openmesh control, the real binary (" .. store .. " store)", function()
  if not H.bin or H.bin == "" then
    it("runs against OPENMESH_BIN", function()
      pending("OPENMESH_BIN is not set (make check sets it to build/bin/openmesh)")
    end)
    return
  end
  if store == "redis" and not R.available then
    it("runs against a real redis-server", function()
      pending("redis-server is not installed (scripts/deps installs it)")
    end)
    return
  end

  local dir, redis
  local n_test = 0
  setup(function()
    dir = H.tmpdir()
    if store == "redis" then
      redis = R.start()
    end
  end)
  teardown(function()
    H.kill_all()
    R.stop_all()
    if dir then
      os.execute("rm -rf " .. H.q(dir))
    end
    if redis then
      os.execute("rm -rf " .. H.q(redis.dir))
    end
  end)
  before_each(function()
    n_test = n_test + 1
  end)

  -- The control plane on this suite's store (a fresh key prefix per test).
  local function start_control(d, args)
    local extra = ""
    if store == "redis" then
      extra = string.format("--store %s --store-prefix t%d: ", redis.url, n_test)
    end
    return H.start_control(d, extra .. (args or ""))
  end

  it("refuses bad command lines with exit 2 and says why", function()
    local bin = "timeout 5 " .. H.q(H.bin) -- never left running
    local out, rc = H.sh(bin .. " control --store redis://127.0.0.1:0/0 2>&1")
    assert.equal(2, rc)
    assert.matches("--store: 'redis://127.0.0.1:0/0' is not a Redis URL", out, 1, true)
    for _, bad in ipairs { "redis://", "redis://h:99999", "redis://u:p@h:1/0",
      "redis://h:1/0?x", "rediss://h:1/0", "redis://h:1/abc", "mysql://h",
      "redis://" .. string.rep("a", 5000) } do
      out, rc = H.sh(bin .. " control --store " .. H.q(bad) .. " 2>&1")
      assert.equal(2, rc, bad)
      assert.matches("--store", out, 1, true)
    end
    out, rc = H.sh(bin .. " control --store memory --store-prefix x: 2>&1")
    assert.equal(2, rc)
    assert.matches("--store-prefix", out, 1, true)
    out, rc = H.sh(bin .. " control --store redis://127.0.0.1:1/0 --store-prefix 'a b' 2>&1")
    assert.equal(2, rc)
    assert.matches("--store-prefix", out, 1, true)
    -- Redis that never answers: retried with a log line, then exit 1
    out, rc = H.sh(bin .. " control --listen 127.0.0.1:0 --store redis://127.0.0.1:1/0 --store-wait 300ms 2>&1")
    assert.equal(1, rc)
    assert.matches("cannot reach Redis at redis://127.0.0.1:1/0", out, 1, true)
    assert.matches('"event":"store_unavailable"', out, 1, true)
    out, rc = H.sh(bin .. " control --listen 0.0.0.0:0 2>&1")
    assert.equal(2, rc)
    assert.matches("refusing to listen on 0.0.0.0 without authentication", out, 1, true)
    out, rc = H.sh(bin .. " control --listen nowhere 2>&1")
    assert.equal(2, rc)
    assert.matches("--listen", out, 1, true)
    out, rc = H.sh(bin .. " control --ping-interval 15 2>&1")
    assert.equal(2, rc)
    assert.matches("--ping-interval", out, 1, true)
    out, rc = H.sh(bin .. " control --tokens /nonexistent/tokens 2>&1")
    assert.equal(2, rc)
    assert.matches("/nonexistent/tokens", out, 1, true)
    out, rc = H.sh(bin .. " control --bogus 2>&1")
    assert.equal(2, rc)
    out, rc = H.sh(bin .. " control --help")
    assert.equal(0, rc)
    assert.matches("usage: openmesh control", out, 1, true)
    -- a runtime failure is 1: the port is taken
    finally(H.kill_all)
    local c = start_control(dir)
    out, rc = H.sh(bin .. " control --listen 127.0.0.1:" .. c.port .. " 2>&1")
    assert.equal(1, rc)
    assert.matches("cannot listen on 127.0.0.1:" .. c.port, out, 1, true)
    assert.equal(0, H.stop(c))
  end)

  it("registers, renews and serves discovery over HTTP", function()
    finally(H.kill_all)
    local c = start_control(dir)
    local r1 = H.register(dir, c.url, "web", "a",
      inst("http://10.0.0.1:8080", 10000, { zone = "z1", metadata = { version = "v1" } }))
    assert.equal("created", r1.change)
    local r2 = H.register(dir, c.url, "web", "a",
      inst("http://10.0.0.1:8080", 10000, { zone = "z1", metadata = { version = "v1" } }))
    assert.equal("renewed", r2.change)
    assert.equal(r1.revision, r2.revision)
    local status, body, headers = H.request(dir, "GET", c.url .. "/v1/services/web")
    assert.equal(200, status)
    assert.equal("application/json", headers["content-type"])
    assert.is_nil(headers["access-control-allow-origin"])
    local snap = H.json(body)
    assert.equal("web", snap.service)
    assert.equal(r1.revision, snap.revision)
    assert.equal("v1", snap.instances[1].metadata.version)
    assert.equal("z1", snap.instances[1].zone)
    assert.equal(cjson.null, snap.next_page_token)
    -- heartbeat, and the 404 that tells a keeper to register again
    status = H.request(dir, "POST", c.url .. "/v1/services/web/instances/a/heartbeat")
    assert.equal(200, status)
    status, body = H.request(dir, "POST", c.url .. "/v1/services/web/instances/x/heartbeat")
    assert.equal(404, status)
    assert.equal("not_found", H.json(body).error)
    -- validation: 400 naming the field, nothing changes
    status, body = H.request(dir, "PUT", c.url .. "/v1/services/web/instances/b",
      { body = '{"url":"http://h","ttl_ms":10}' })
    assert.equal(400, status)
    assert.same({ "invalid_field", "ttl_ms" }, { H.json(body).error, H.json(body).field })
    status, body = H.request(dir, "GET", c.url .. "/v1/services")
    assert.equal(200, status)
    assert.same({ { service = "web", revision = r1.revision, instances = 1 } },
      H.json(body).services)
    -- operations
    status, body = H.request(dir, "GET", c.url .. "/healthz")
    assert.same({ 200, "ok\n" }, { status, body })
    status, body = H.request(dir, "GET", c.url .. "/readyz")
    assert.same({ 200, true }, { status, H.json(body).ready })
    status, body = H.request(dir, "GET", c.url .. "/status")
    assert.equal(200, status)
    local st = H.json(body)
    assert.equal(store, st.store)
    assert.equal(false, st.stale)
    assert.equal(1, st.instances)
    assert.equal(r1.revision, st.revision)
    status, body = H.request(dir, "GET", c.url .. "/metrics")
    assert.equal(200, status)
    assert.matches("openmesh_control_registrations_total 1\n", body, 1, true)
    assert.matches("openmesh_control_renewals_total 2\n", body, 1, true)
    assert.matches('openmesh_control_rejections_total{reason="invalid_field"} 1\n', body, 1, true)
    -- one log line per registration change and per rejection
    local log = H.readfile(c.out)
    assert.matches('"event":"registration","change":"created","service":"web","id":"a"', log, 1, true)
    assert.matches('"event":"request_rejected","reason":"invalid_field"', log, 1, true)
    assert.equal(0, H.stop(c))
  end)

  it("serves discovery gzip-compressed to a client that accepts it, the same document", function()
    finally(H.kill_all)
    local c = start_control(dir)
    for i = 1, 200 do
      H.register(dir, c.url, "big", "i" .. i,
        inst("http://10.0.0." .. i .. ":8080", 60000, { zone = "z1", metadata = { version = "v1" } }))
    end
    local url = H.q(c.url .. "/v1/services/big")
    -- one GET: status, Content-Encoding, Vary and the body's size
    local function get(accept)
      local out = H.sh(string.format(
        "curl -s -o %s -D - -w 'size=%%{size_download}\\n' %s %s",
        H.q(dir .. "/gz.body"), accept and ("-H " .. H.q("Accept-Encoding: " .. accept)) or "", url))
      return {
        status = tonumber(out:match("^HTTP/1.1 (%d+)")),
        encoding = out:match("\n[Cc]ontent%-[Ee]ncoding: ([^\r\n]+)"),
        vary = out:match("\n[Vv]ary: ([^\r\n]+)"),
        size = tonumber(out:match("size=(%d+)")),
      }
    end
    local plain, gz = get(nil), get("gzip")
    assert.equal(200, plain.status)
    assert.is_nil(plain.encoding)
    assert.equal("Accept-Encoding", plain.vary)
    assert.equal(200, gz.status)
    assert.equal("gzip", gz.encoding)
    assert.equal("Accept-Encoding", gz.vary)
    assert(gz.size * 5 < plain.size, "gzip " .. gz.size .. " B, plain " .. plain.size .. " B")
    -- what curl decodes is the plain document, byte for byte
    local a = H.sh("curl -s " .. url)
    local b = H.sh("curl -s --compressed " .. url)
    assert.equal(#a, #b)
    assert.is_true(a == b, "the decoded document differs from the plain one")
    assert.equal(200, #H.json(b).instances)
    -- weights and wildcards (RFC 9110 12.5.3)
    for accept, want in pairs { ["gzip;q=0"] = false, ["gzip;q=0.000, br"] = false,
      ["br, x-gzip"] = true, ["*"] = true, ["*;q=0"] = false, ["gzip;q=0, *"] = false,
      ["identity"] = false, ["GZIP; q=0.5"] = true, ["deflate, *;q=0.1"] = true } do
      local r = get(accept)
      assert.equal(200, r.status)
      assert(want == (r.encoding == "gzip"),
        "Accept-Encoding: " .. accept .. " -> " .. tostring(r.encoding) .. ", want gzip " .. tostring(want))
    end
    assert.equal(0, H.stop(c))
  end)

  it("streams the first snapshot and every change to curl -N, and ends streams cleanly on SIGTERM", function()
    finally(H.kill_all)
    local c = start_control(dir)
    local r1 = H.register(dir, c.url, "web", "a", inst("http://10.0.0.1:80"))
    local w = H.watch(dir, c.url .. "/v1/watch/services/web")
    local all = H.watch(dir, c.url .. "/v1/watch/services")
    local evs = H.wait_events(w, 1)
    assert.equal(1, #evs)
    assert.equal("snapshot", evs[1].type)
    assert.equal(H.rev(r1.revision), evs[1].id)
    assert.same({ "a" }, ids_of(H.json(evs[1].data)))
    -- A watch starts from the state current when it is established: had
    -- b registered before the all-services watch was, its first snapshot
    -- would already hold a and b and no second event would follow. Its
    -- first event (web with a only) says it is established.
    local first = H.wait_events(all, 1)
    assert.equal(1, #first)
    assert.same({ "a" }, ids_of(H.json(first[1].data)))
    local r2 = H.register(dir, c.url, "web", "b", inst("http://10.0.0.2:80"))
    evs = H.wait_events(w, 2)
    assert.equal(2, #evs)
    assert.equal(H.rev(r2.revision), evs[2].id)
    assert.is_true(math.tointeger(tonumber(evs[2].id)) > math.tointeger(tonumber(evs[1].id)))
    assert.same({ "a", "b" }, ids_of(H.json(evs[2].data)))
    local every = H.wait_events(all, 2)
    assert.equal(2, #every)
    assert.equal(H.rev(r2.revision), every[2].id)
    assert.same({ "a", "b" }, ids_of(H.json(every[2].data)))
    local _, comments, retry = H.events(w)
    assert.is_true(retry ~= nil and retry > 0)
    assert.equal(0, comments)
    -- SIGTERM: exit 0, and the streams end with the final chunk (curl: 0)
    assert.equal(0, H.stop(c))
    assert.equal(0, H.exit_status(w))
    assert.equal(0, H.exit_status(all))
  end)

  it("sends pings on idle streams", function()
    finally(H.kill_all)
    local c = start_control(dir, "--ping-interval 100ms")
    local w = H.watch(dir, c.url .. "/v1/watch/config/nothing-yet")
    local n = H.wait_for(function()
      local _, comments = H.events(w)
      return comments >= 2 and comments
    end, 3)
    assert.is_truthy(n)
    assert.equal(0, #H.events(w))
  end)

  it("answers Last-Event-ID: no duplicate for the current revision, the snapshot for a stale one", function()
    finally(H.kill_all)
    local c = start_control(dir)
    H.register(dir, c.url, "web", "a", inst("http://10.0.0.1:80"))
    local r = H.register(dir, c.url, "web", "b", inst("http://10.0.0.2:80"))
    local url = c.url .. "/v1/watch/services/web"
    local out, rc = H.sh(H.curl(1) .. " -sN -H " .. H.q("Last-Event-ID: " .. H.rev(r.revision))
      .. " " .. H.q(url))
    assert.equal(28, rc) -- still open when curl gave up
    local evs, _, retry = H.parse_sse(out)
    assert.equal(0, #evs)
    assert.is_truthy(retry)
    out = H.sh(H.curl(1) .. " -sN -H " .. H.q("Last-Event-ID: " .. H.rev(r.revision - 1))
      .. " " .. H.q(url))
    evs = H.parse_sse(out)
    assert.equal(1, #evs)
    assert.equal(H.rev(r.revision), evs[1].id)
    out = H.sh(H.curl(1) .. " -sN -H 'Last-Event-ID: not-a-number' " .. H.q(url))
    assert.equal(1, #H.parse_sse(out))
    -- a reconnect at the current revision gets the next change, once
    local w = H.watch(dir, url, { "Last-Event-ID: " .. H.rev(r.revision) })
    H.sleep(0.2)
    assert.equal(0, #H.events(w))
    local r3 = H.register(dir, c.url, "web", "c", inst("http://10.0.0.3:80"))
    evs = H.wait_events(w, 1)
    assert.equal(1, #evs)
    assert.equal(H.rev(r3.revision), evs[1].id)
  end)

  it("removes an instance whose lease is not renewed within ttl + 1 s", function()
    finally(H.kill_all)
    local c = start_control(dir)
    H.register(dir, c.url, "lease", "keep", inst("http://10.0.0.1:80", 60000))
    local w = H.watch(dir, c.url .. "/v1/watch/services/lease")
    assert.equal(1, #H.wait_events(w, 1))
    local t0 = H.now()
    H.register(dir, c.url, "lease", "short", inst("http://10.0.0.2:80", 1000))
    local gone = H.wait_for(function()
      local _, body = H.request(dir, "GET", c.url .. "/v1/services/lease")
      local snap = H.json(body)
      return #snap.instances == 1 and snap
    end, 4, 0.02)
    local elapsed = H.now() - t0
    assert.is_truthy(gone)
    assert.same({ "keep" }, ids_of(gone))
    assert.is_true(elapsed >= 0.95, "removed after " .. elapsed .. " s")
    assert.is_true(elapsed <= 2.0, "removed after " .. elapsed .. " s")
    -- the watcher saw the registration and then the expiry
    local evs = H.wait_events(w, 3)
    assert.same({ "keep" }, ids_of(H.json(evs[#evs].data)))
    assert.matches('"change":"expired","service":"lease","id":"short"', H.readfile(c.out), 1, true)
  end)

  it("removes the lease of a keeper killed with kill -9 within ttl + 1 s", function()
    finally(H.kill_all)
    local c = start_control(dir)
    local keeper = H.spawn(string.format(
      "%s register --control %s --service kept --id k1 --url http://127.0.0.1:9 --ttl 1s",
      H.q(H.bin), H.q(c.url)), dir, "keeper")
    local function present()
      local status, body = H.request(dir, "GET", c.url .. "/v1/services/kept")
      return status == 200 and #H.json(body).instances == 1
    end
    assert.is_truthy(H.wait_for(present, 5))
    H.sleep(1.5) -- longer than the ttl: the keeper renews
    assert.is_true(present())
    H.kill(keeper.pid, "KILL")
    local t0 = H.now()
    assert.is_truthy(H.wait_for(function()
      return not present()
    end, 4, 0.02))
    local elapsed = H.now() - t0
    assert.is_true(elapsed <= 2.0, "removed " .. elapsed .. " s after kill -9")
  end)

  it("keeps revisions increasing across a restart", function()
    finally(H.kill_all)
    local c1 = start_control(dir)
    local r1 = H.register(dir, c1.url, "web", "a", inst("http://10.0.0.1:80"))
    assert.equal(0, H.stop(c1))
    local c2 = start_control(dir)
    local r2 = H.register(dir, c2.url, "web", "a", inst("http://10.0.0.1:80"))
    if store == "memory" then
      assert.equal("created", r2.change) -- the memory store starts empty
    else
      assert.equal("renewed", r2.change) -- Redis kept it: nothing changed
      assert.equal(r1.revision, r2.revision)
      r2 = H.register(dir, c2.url, "web", "a", inst("http://10.0.0.2:80"))
      assert.equal("updated", r2.change)
    end
    assert.is_true(r2.revision > r1.revision, r2.revision .. " <= " .. r1.revision)
    assert.equal(0, H.stop(c2))
    -- a persisted high-water mark far ahead of the clock is honoured
    local floor = r2.revision + 1000000000000
    local c3 = start_control(dir, "--min-revision " .. H.rev(floor))
    local r3 = H.register(dir, c3.url, "web", "a", inst("http://10.0.0.3:80"))
    assert.is_true(r3.revision > floor)
    assert.equal(0, H.stop(c3))
  end)

  it("pages through 1,000 instances while others register, never mixing revisions", function()
    finally(H.kill_all)
    local c = start_control(dir)
    -- 1,000 registrations on one keep-alive connection
    local cfg = {}
    for i = 0, 999 do
      cfg[#cfg + 1] = string.format(
        'url = "%s/v1/services/big/instances/i%04d"\nrequest = "PUT"\n'
          .. 'data = "{\\"url\\":\\"http://10.1.%d.%d:80\\",\\"ttl_ms\\":60000}"\n'
          .. 'output = "/dev/null"\nwrite-out = "%%{http_code}\\n"\n',
        c.url, i, i // 250, i % 250)
    end
    H.writefile(dir .. "/bulk.cfg", table.concat(cfg, "next\n"))
    local out = H.sh(H.curl(30) .. " -s -K " .. H.q(dir .. "/bulk.cfg"))
    local ok = select(2, out:gsub("200", ""))
    assert.equal(1000, ok)

    local function page(token, size)
      local url = c.url .. "/v1/services/big?page_size=" .. (size or 100)
      if token then
        url = url .. "&page_token=" .. token
      end
      local status, body = H.request(dir, "GET", url)
      return status, H.json(body)
    end

    -- deterministic: a token from before a change is refused
    local status, p1 = page()
    assert.equal(200, status)
    assert.equal(100, #p1.instances)
    local r = H.register(dir, c.url, "big", "zz-late", inst("http://10.2.0.1:80", 60000))
    local status2, err = page(p1.next_page_token)
    assert.equal(409, status2)
    assert.equal("revision_changed", err.error)
    assert.equal(r.revision, err.revision)

    -- concurrent: walks either complete at one revision or get 409
    local registrar = H.spawn(string.format(
      "sh -c 'for i in $(seq 1 20); do timeout -k 1 5 curl -s --max-time 2 -o /dev/null -X PUT "
        .. "-d \"{\\\"url\\\":\\\"http://10.3.0.1:80\\\",\\\"ttl_ms\\\":60000}\" "
        .. "%s/v1/services/big/instances/extra$i; sleep 0.2; done'", c.url), dir, "registrar")
    local complete, conflicts, deadline = 0, 0, H.now() + 40
    repeat
      local rev, ids, token, done = nil, {}, nil, false
      while true do
        local st, pg = page(token)
        if st == 409 then
          assert.equal("revision_changed", pg.error)
          conflicts = conflicts + 1
          break
        end
        assert.equal(200, st)
        rev = rev or pg.revision
        assert.equal(rev, pg.revision) -- never a page of another revision
        for _, i in ipairs(pg.instances) do
          ids[#ids + 1] = i.id
        end
        if pg.next_page_token == cjson.null then
          done = true
          break
        end
        token = pg.next_page_token
      end
      if done then
        for k = 2, #ids do
          assert.is_true(ids[k - 1] < ids[k], "order or duplicate at " .. k)
        end
        assert.is_true(#ids >= 1001)
        complete = complete + 1
      end
    until (complete >= 1 and not H.alive(registrar.pid)) or H.now() > deadline
    assert.is_true(complete >= 1)
    assert.equal(0, H.exit_status(registrar))
    local _, full = H.request(dir, "GET", c.url .. "/v1/services/big")
    assert.equal(1021, #H.json(full).instances)
    print(string.format("\n# paging under registrations: %d complete walks, %d restarts (409)",
      complete, conflicts))
  end)

  it("keeps the last accepted config when an invalid one is pushed", function()
    finally(H.kill_all)
    local c = start_control(dir)
    local lua = { "Content-Type: text/x-lua" }
    local status, body = H.request(dir, "PUT", c.url .. "/v1/config/traffic",
      { body = POLICY, headers = lua })
    assert.equal(200, status)
    local good = H.json(body)
    local w = H.watch(dir, c.url .. "/v1/watch/config/traffic")
    local evs = H.wait_events(w, 1)
    assert.equal(POLICY, evs[1].data)
    assert.equal(H.rev(good.revision), evs[1].id)
    -- a syntax error and a failing example: 422 with file:line, nothing changes
    status, body = H.request(dir, "PUT", c.url .. "/v1/config/traffic",
      { body = "return {\n  kind = = 1\n}\n", headers = lua })
    assert.equal(422, status)
    assert.equal("invalid_policy", H.json(body).error)
    assert.matches("^traffic:2:", H.json(body).message)
    status = H.request(dir, "PUT", c.url .. "/v1/config/traffic",
      { body = POLICY:gsub("return peers end", "return {} end"), headers = lua })
    assert.equal(422, status)
    status, body = H.request(dir, "GET", c.url .. "/v1/config/traffic")
    assert.same({ 200, POLICY }, { status, body })
    -- JSON documents
    status = H.request(dir, "PUT", c.url .. "/v1/config/limits", { body = '{"max":1}' })
    assert.equal(200, status)
    status, body = H.request(dir, "PUT", c.url .. "/v1/config/limits", { body = '{"max":' })
    assert.equal(400, status)
    assert.equal("invalid_json", H.json(body).error)
    status, body = H.request(dir, "GET", c.url .. "/v1/config/limits")
    assert.same({ 200, '{"max":1}' }, { status, body })
    -- watchers only ever saw accepted versions
    H.sleep(0.1)
    assert.equal(1, #H.events(w))
    local v2 = POLICY:gsub('"a"}}', '"a"}, {id = "b"}}'):gsub('expect = {"a"}', 'expect = {"a", "b"}')
    status = H.request(dir, "PUT", c.url .. "/v1/config/traffic", { body = v2, headers = lua })
    assert.equal(200, status)
    evs = H.wait_events(w, 2)
    assert.equal(v2, evs[2].data)
  end)

  it("answers smuggling and garbage with an error or a close, and keeps serving others", function()
    finally(H.kill_all)
    local c = start_control(dir)
    local r = H.register(dir, c.url, "web", "a", inst("http://10.0.0.1:80"))
    local w = H.watch(dir, c.url .. "/v1/watch/services/web")
    assert.equal(1, #H.wait_events(w, 1))
    local smuggle = "PUT /v1/services/web/instances/x HTTP/1.1\r\nHost: t\r\n"
      .. "Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n"
      .. "DELETE /v1/services/web/instances/a HTTP/1.1\r\nHost: t\r\n\r\n"
    local out = H.raw(c.port, smuggle)
    assert.matches("^HTTP/1%.1 400", out)
    assert.equal(1, select(2, out:gsub("HTTP/1%.1 ", ""))) -- one answer only
    for _, bad in ipairs({
      "PUT /v1/services/web/instances/x HTTP/1.1\r\nHost: t\r\nContent-Length: 1\r\n"
        .. "Content-Length: 30\r\n\r\n{}",
      "GET /v1/services HTTP/1.1\r\nHost: t\r\nX: a\r\n folded\r\n\r\n",
      "GET /v1/services HTTP/1.1\r\nHost: t\r\nTransfer-Encoding: gzip\r\n\r\n",
    }) do
      assert.matches("^HTTP/1%.1 [45]%d%d", H.raw(c.port, bad))
    end
    math.randomseed(42)
    for _ = 1, 10 do
      local bytes = {}
      for k = 1, 200 do
        bytes[k] = string.char(math.random(0, 255))
      end
      local ans = H.raw(c.port, table.concat(bytes), 1)
      assert.is_true(ans == "" or ans:match("^HTTP/1%.1 [45]%d%d") ~= nil, ans)
    end
    -- nothing was smuggled in, everyone else is still served
    local status, body = H.request(dir, "GET", c.url .. "/v1/services/web")
    assert.equal(200, status)
    local snap = H.json(body)
    assert.equal(r.revision, snap.revision)
    assert.same({ "a" }, ids_of(snap))
    H.register(dir, c.url, "web", "b", inst("http://10.0.0.2:80"))
    assert.equal(2, #H.wait_events(w, 2))
    assert.is_true(H.alive(c.pid))
  end)

  it("authenticates with bearer tokens by role and re-reads them on SIGHUP", function()
    finally(H.kill_all)
    local tokens = dir .. "/tokens"
    H.writefile(tokens, "reader-1 read\nreg-1 register\nadmin-1 admin\n")
    local c = start_control(dir, "--tokens " .. H.q(tokens) .. " --cors-origin '*'")
    local function get(token)
      return (H.request(dir, "GET", c.url .. "/v1/services",
        { headers = token and { "Authorization: Bearer " .. token } or nil }))
    end
    local status, _, headers = H.request(dir, "GET", c.url .. "/v1/services")
    assert.equal(401, status)
    assert.equal('Bearer realm="openmesh"', headers["www-authenticate"])
    assert.equal("*", headers["access-control-allow-origin"])
    assert.equal(401, get("wrong"))
    assert.equal(200, get("reader-1"))
    local put = function(token)
      return (H.request(dir, "PUT", c.url .. "/v1/services/web/instances/a", {
        body = '{"url":"http://10.0.0.1","ttl_ms":10000}',
        headers = { "Authorization: Bearer " .. token } }))
    end
    assert.equal(403, put("reader-1"))
    assert.equal(200, put("reg-1"))
    assert.equal(403, (H.request(dir, "PUT", c.url .. "/v1/config/x",
      { body = "{}", headers = { "Authorization: Bearer reg-1" } })))
    assert.equal(200, (H.request(dir, "PUT", c.url .. "/v1/config/x",
      { body = "{}", headers = { "Authorization: Bearer admin-1" } })))
    assert.equal(200, (H.request(dir, "GET", c.url .. "/healthz")))
    assert.equal(200, (H.request(dir, "GET", c.url .. "/metrics")))
    -- EventSource cannot send headers: access_token in the query
    local out = H.sh(H.curl(1) .. " -sN " .. H.q(c.url .. "/v1/watch/services/web?access_token=reader-1"))
    assert.equal(1, #H.parse_sse(out))
    -- SIGHUP: new tokens in force, old ones gone
    H.writefile(tokens, "reader-2 read\n")
    H.kill(c.pid, "HUP")
    assert.is_truthy(H.wait_for(function()
      return get("reader-2") == 200
    end, 5))
    assert.equal(401, get("reader-1"))
    -- a bad file keeps the tokens in force and says so in the log
    H.writefile(tokens, "no-roles-here\n")
    H.kill(c.pid, "HUP")
    assert.is_truthy(H.wait_for(function()
      return H.readfile(c.out):find('"event":"auth_reload_failed"', 1, true)
    end, 5))
    assert.equal(200, get("reader-2"))
    assert.equal(0, H.stop(c))
  end)

  it("2,000 watchers that stop reading and 300 changes: bounded memory, none cut, each gets the latest", function()
    finally(H.kill_all)
    local c = start_control(dir)
    -- a 100-instance service
    local body_a, body_b = dir .. "/inst-a.json", dir .. "/inst-b.json"
    H.writefile(body_a, '{"url":"http://10.1.0.1:80","ttl_ms":600000,"metadata":{"v":"a"}}')
    H.writefile(body_b, '{"url":"http://10.1.0.1:80","ttl_ms":600000,"metadata":{"v":"b"}}')
    local urls = {}
    for i = 1, 100 do
      urls[#urls + 1] = H.q(string.format("%s/v1/services/big/instances/i%03d", c.url, i))
    end
    H.sh(H.curl(30) .. " -s -o /dev/null -X PUT --data-binary @" .. H.q(body_a) .. " " .. table.concat(urls, " "))
    local trigger = dir .. "/slow-trigger"
    os.remove(trigger)
    local slow = H.spawn(string.format("/usr/bin/python3 %s %d /v1/watch/services/big 2000 %s",
      H.q(here .. "../../tests/fixtures/slow_watchers.py"), c.port, H.q(trigger)), dir, "slow")
    assert.is_truthy(H.wait_for(function()
      return H.readfile(slow.out):find("opened 2000", 1, true) or H.readfile(slow.rcfile) ~= ""
    end, 60), H.readfile(slow.out))
    assert.matches("opened 2000", H.readfile(slow.out), 1, true)
    local function rss_kb()
      return tonumber(H.readfile("/proc/" .. c.pid .. "/status"):match("VmRSS:%s*(%d+)"))
    end
    local rss0 = rss_kb()
    -- 300 changes: one instance's metadata flips back and forth
    local args = {}
    for k = 1, 300 do
      args[#args + 1] = string.format("-X PUT --data-binary @%s %s", H.q(k % 2 == 1 and body_b or body_a),
        H.q(c.url .. "/v1/services/big/instances/i001"))
    end
    H.sh(H.curl(60) .. " -s -o /dev/null " .. table.concat(args, " --next -s -o /dev/null "))
    local st, snap = H.request(dir, "GET", c.url .. "/v1/services/big")
    assert.equal(200, st)
    local rev = H.rev(H.json(snap).revision)
    local rss1 = rss_kb()
    -- without coalescing each watcher queued every revision: about 2 GB
    assert.is_true(rss1 < 150 * 1024, string.format("RSS %d kB after the changes (%d kB before)", rss1, rss0))
    local _, metrics = H.request(dir, "GET", c.url .. "/metrics")
    assert.matches('openmesh_control_watchers_dropped_total{reason="backlog"} 0', metrics, 1, true)
    assert.is_truthy(tonumber(metrics:match("openmesh_control_watch_events_coalesced_total (%d+)")) > 0)
    H.writefile(trigger .. ".tmp", rev)
    assert(os.rename(trigger .. ".tmp", trigger))
    assert.is_truthy(H.wait_for(function() return H.readfile(slow.rcfile) ~= "" end, 40))
    local res = H.json(H.readfile(slow.out):match("({.*})"))
    assert.same({ latest = 2000, of = 2000 }, res)
  end)

  it("ends an open watch within a second when a reload takes its token's role, and refuses two credentials", function()
    finally(H.kill_all)
    local tokens = dir .. "/tokens-revoke"
    H.writefile(tokens, "stays read\nleaves read\ndemoted read\nwriter register\n")
    local c = start_control(dir, "--tokens " .. H.q(tokens))
    local function watch(token)
      return H.watch(dir, c.url .. "/v1/watch/services/web",
        { "Authorization: Bearer " .. token }, 20)
    end
    local function put(id)
      assert.equal(200, (H.request(dir, "PUT", c.url .. "/v1/services/web/instances/" .. id, {
        body = '{"url":"http://10.0.0.1","ttl_ms":10000}',
        headers = { "Authorization: Bearer writer" } })))
    end
    put("a")
    local ws, wl, wd = watch("stays"), watch("leaves"), watch("demoted")
    for _, w in ipairs({ ws, wl, wd }) do
      assert.is_truthy(H.wait_for(function() return #H.events(w) >= 1 end, 5))
    end
    -- a duplicate line would add up roles: refused, the file in force stays
    H.writefile(tokens, "stays read\nstays admin\n")
    H.kill(c.pid, "HUP")
    assert.is_truthy(H.wait_for(function()
      return H.readfile(c.out):find(":2: the same token as line 1", 1, true)
    end, 5))
    H.writefile(tokens, "stays read\ndemoted register\nwriter register\n")
    local t0 = H.now()
    H.kill(c.pid, "HUP")
    for _, w in ipairs({ wl, wd }) do
      assert.is_truthy(H.wait_for(function()
        return H.readfile(w.out):find("event: revoked", 1, true) and H.readfile(w.rcfile) ~= ""
      end, 5), "the stream went on: " .. H.readfile(w.out):sub(-300))
    end
    local took = H.now() - t0
    assert.is_true(took < 1.5, "revocation took " .. took .. " s")
    -- the one that keeps its role still gets changes
    put("b")
    assert.is_truthy(H.wait_for(function()
      local ev = H.events(ws)
      return #ev >= 2 and #H.json(ev[#ev].data).instances == 2
    end, 5))
    assert.is_nil(H.readfile(ws.out):find("revoked", 1, true))
    assert.truthy(H.readfile(c.out):find('"event":"watcher_revoked"', 1, true))
    local _, metrics = H.request(dir, "GET", c.url .. "/metrics")
    assert.matches('openmesh_control_watchers_dropped_total{reason="revoked"} 2', metrics, 1, true)
    -- two Authorization headers: 400, whichever would have counted
    local st, body = H.request(dir, "GET", c.url .. "/v1/services",
      { headers = { "Authorization: Bearer stays", "Authorization: Bearer writer" } })
    assert.equal(400, st)
    assert.equal("invalid_header", H.json(body).error)
    assert.equal("authorization", H.json(body).field)
    assert.equal(0, H.stop(c))
  end)
end)
end
