-- bench/wrk/post4k.lua: every request is a POST with a 4 KiB body
-- (Content-Length framed); the upstream answers 200 "ok" and discards it.
wrk.method = "POST"
wrk.body = string.rep("x", 4096)
wrk.headers["Content-Type"] = "application/octet-stream"
