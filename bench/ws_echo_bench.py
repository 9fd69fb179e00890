#!/usr/bin/python3
"""bench/ws_echo_bench.py OPENMESH_BIN: WebSocket echo round trips through
`openmesh proxy --static` against the same echo server straight, in one
run (docs/BENCHMARKS.md "Data plane").

One echo server (tests/fixtures/ws_echo.py, Debian's python3-websockets),
one proxy in front of it. A client (this process, the same library) keeps
one connection to each and sends one message at a time, waiting for its
echo: OM_BENCH_WS_MESSAGES (2000) per round, OM_BENCH_WS_ROUNDS (6)
rounds, alternating which connection goes first, after 200 warm-up
messages on each. The figure is the median over all round trips of a
contender (the rounds pooled), in microseconds; the ratio is proxy over
direct. The client and the server are Python, so both figures carry their
cost alike; the difference is what the proxy adds.

Prints `name value unit` lines, as the other benches do; details go to
stderr. Loopback only; every process it starts is stopped by pid at the
end.
"""
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time

import websockets

HERE = os.path.dirname(os.path.abspath(__file__))
ECHO = os.path.join(HERE, "..", "tests", "fixtures", "ws_echo.py")
POLICY = """return {
  kind = "traffic",
  subset = function(_, peers) return peers end,
}
"""


def wait_line(proc_out, pattern, timeout=10):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        with open(proc_out) as f:
            m = re.search(pattern, f.read())
        if m:
            return m
        time.sleep(0.05)
    raise SystemExit("ws_echo_bench: no %r in %s" % (pattern, proc_out))


async def rtts(ws, n):
    out = []
    msg = "x" * 32
    for _ in range(n):
        t0 = time.perf_counter_ns()
        await ws.send(msg)
        await ws.recv()
        out.append((time.perf_counter_ns() - t0) / 1000.0)
    return out


async def run(echo_port, proxy_port, messages, rounds):
    direct = await websockets.connect("ws://127.0.0.1:%d/" % echo_port)
    proxied = await websockets.connect(
        "ws://ws:%d/" % proxy_port, host="127.0.0.1", port=proxy_port)
    got = {"direct": [], "proxy": []}
    await rtts(direct, 200)
    await rtts(proxied, 200)
    for r in range(rounds):
        order = [("direct", direct), ("proxy", proxied)]
        if r % 2:
            order.reverse()
        for name, ws in order:
            x = await rtts(ws, messages)
            got[name].extend(x)
            print("round %d %-6s p50 %.1f us" % (r, name, statistics.median(x)),
                  file=sys.stderr)
    await direct.close()
    await proxied.close()
    return got


def main():
    binary = sys.argv[1]
    messages = int(os.environ.get("OM_BENCH_WS_MESSAGES", "2000"))
    rounds = int(os.environ.get("OM_BENCH_WS_ROUNDS", "6"))
    procs = []
    with tempfile.TemporaryDirectory() as d:
        try:
            echo_out = os.path.join(d, "echo.out")
            procs.append(subprocess.Popen(
                ["/usr/bin/python3", ECHO], stdout=open(echo_out, "w"),
                stderr=subprocess.STDOUT))
            echo_port = int(wait_line(echo_out, r"listening (\d+)").group(1))
            with open(os.path.join(d, "traffic.lua"), "w") as f:
                f.write(POLICY)
            with open(os.path.join(d, "static.json"), "w") as f:
                json.dump({"services": {"ws": {"instances": [
                    {"id": "echo", "url": "http://127.0.0.1:%d" % echo_port}]}}}, f)
            proxy_out = os.path.join(d, "proxy.out")
            procs.append(subprocess.Popen(
                [binary, "proxy", "--listen", "127.0.0.1:0", "--admin",
                 "127.0.0.1:0", "--policy",
                 os.path.join(d, "traffic.lua"), "--static",
                 os.path.join(d, "static.json")],
                stdout=open(proxy_out, "w"), stderr=subprocess.STDOUT))
            m = wait_line(proxy_out, r'"proxy_listening","url":"http://127\.0\.0\.1:(\d+)"')
            got = asyncio.run(run(echo_port, int(m.group(1)), messages, rounds))
        finally:
            for p in procs:
                p.terminate()
            for p in procs:
                p.wait(timeout=10)
    d50 = statistics.median(got["direct"])
    p50 = statistics.median(got["proxy"])
    print("direct_ws_echo_rtt_us %.1f us" % d50)
    print("proxy_ws_echo_rtt_us %.1f us" % p50)
    print("proxy_ws_echo_rtt_ratio %.3f x" % (p50 / d50))


if __name__ == "__main__":
    main()
