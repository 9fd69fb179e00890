-- bench/wrk/sessions.lua: every request carries one of a fixed set of
-- sessions (x-session: s-0 ... s-(N-1), N from OM_BENCH_SESSIONS, 1024 by
-- default), taken in turn, so keyed selection (rendezvous in the proxy,
-- `hash $http_x_session consistent` in nginx, `balance hdr(x-session)`
-- with `hash-type consistent` in HAProxy) runs on every call while the
-- proxy's decision cache holds each session's subset after its first call.
local sessions = tonumber(os.getenv("OM_BENCH_SESSIONS") or "") or 1024
local threads = 0

function setup(thread)
  threads = threads + 1
  thread:set("tid", threads)
end

local n = 0

function request()
  -- threads start at different points of the cycle
  n = n + 1
  wrk.headers["x-session"] = "s-" .. ((n + tid * 7919) % sessions)
  return wrk.format()
end
