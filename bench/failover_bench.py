#!/usr/bin/python3
"""bench/failover_bench.py OPENMESH_BIN: how long a topology change takes
to reach a proxy whose control plane has just died, against the same
change while its plane is up (docs/BENCHMARKS.md "Control-plane
failover").

One redis-server, two `openmesh control` planes on it (A and B), one
`openmesh proxy --control A,B --service web`. Each round (after one
warm-up round):
  steady    PUT a new instance through the plane the proxy does not use;
            the time from just before the PUT to the proxy's
            `watch_snapshot` line for the revision the PUT answered. Twice
            (steady, steady2: the A/A pair).
  failover  kill -9 the plane the proxy's watch uses, then the same PUT
            through the other plane; the time from just before the kill to
            the proxy's line for that revision: the watch sees its stream
            reset, moves to the other plane at once, resumes with
            Last-Event-ID and gets the newer snapshot. The killed plane is
            started again on its port before the next round.
The order of steady and failover alternates per round. Figures: the
median of each over OM_BENCH_FAILOVER_ROUNDS (7) rounds, in ms; the
ratio failover / steady; the A/A noise steady2 / steady. The proxy's log
is read by this process as it grows (1 ms polls), so each figure carries
up to ~1 ms of polling and one curl start.

Prints `name value unit` lines, as the other benches do; details go to
stderr. Loopback only, ports OM_BENCH_FAILOVER_PORT (19600) ..+4; every
process it starts is stopped by pid at the end. About 30 s.
"""
import json
import os
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request

ROUNDS = int(os.environ.get("OM_BENCH_FAILOVER_ROUNDS", "7"))
BASE = int(os.environ.get("OM_BENCH_FAILOVER_PORT", "19600"))


def log(*a):
    print("failover_bench:", *a, file=sys.stderr)


class Mesh:
    def __init__(self, binary, tmp):
        self.bin, self.tmp, self.procs = binary, tmp, []
        self.redis_port = BASE
        self.plane_ports = [BASE + 1, BASE + 2]
        self.planes = ["http://127.0.0.1:%d" % p for p in self.plane_ports]
        self.plane_procs = [None, None]
        self.n_out = 0

    def spawn(self, args, name):
        self.n_out += 1
        path = os.path.join(self.tmp, "%s.%d.log" % (name, self.n_out))
        f = open(path, "w")
        p = subprocess.Popen(args, stdout=f, stderr=subprocess.STDOUT)
        f.close()
        self.procs.append(p)
        return p, path

    def wait_http(self, url, timeout=10):
        t0 = time.monotonic()
        while time.monotonic() - t0 < timeout:
            try:
                urllib.request.urlopen(url, timeout=1).read()
                return
            except Exception:
                time.sleep(0.02)
        raise SystemExit("failover_bench: %s did not answer" % url)

    def start_redis(self):
        self.spawn(["redis-server", "--port", str(self.redis_port), "--bind",
                    "127.0.0.1", "--save", "", "--appendonly", "no", "--dir",
                    self.tmp], "redis")
        t0 = time.monotonic()
        while subprocess.call(["redis-cli", "-p", str(self.redis_port), "ping"],
                              stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL) != 0:
            if time.monotonic() - t0 > 10:
                raise SystemExit("failover_bench: redis-server did not start")
            time.sleep(0.05)

    def start_plane(self, i):
        p, _ = self.spawn([self.bin, "control", "--listen",
                           "127.0.0.1:%d" % self.plane_ports[i], "--store",
                           "redis://127.0.0.1:%d/0" % self.redis_port,
                           "--store-prefix", "bench:"], "plane%d" % i)
        self.plane_procs[i] = p
        self.wait_http(self.planes[i] + "/healthz")

    def kill_plane(self, i):
        p = self.plane_procs[i]
        p.send_signal(signal.SIGKILL)
        p.wait()
        self.plane_procs[i] = None

    def start_proxy(self):
        _, self.proxy_log = self.spawn(
            [self.bin, "proxy", "--listen", "127.0.0.1:%d" % (BASE + 3),
             "--admin", "127.0.0.1:%d" % (BASE + 4), "--control",
             ",".join(self.planes), "--service", "web", "--log-level", "info"],
            "proxy")
        self.admin = "http://127.0.0.1:%d" % (BASE + 4)
        self.wait_http(self.admin + "/healthz")
        self.log_pos = 0

    def watched_plane(self):
        with urllib.request.urlopen(self.admin + "/status", timeout=2) as r:
            w = json.load(r)["watches"]["web"]
        return self.planes.index(w["control"]), w["state"]

    def put(self, plane, iid):
        body = json.dumps({"url": "http://127.0.0.1:9", "ttl_ms": 600000})
        req = urllib.request.Request(
            "%s/v1/services/web/instances/%s" % (self.planes[plane], iid),
            data=body.encode(), method="PUT",
            headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(req, timeout=5) as r:
            return int(json.load(r)["revision"])

    def wait_snapshot(self, revision, timeout=10):
        want = '"event":"watch_snapshot","service":"web","revision":"%d"' % revision
        t0 = time.monotonic()
        with open(self.proxy_log) as f:
            buf = ""
            while time.monotonic() - t0 < timeout:
                chunk = f.read()
                if chunk:
                    buf += chunk
                    if want in buf:
                        return time.monotonic()
                else:
                    time.sleep(0.001)
        raise SystemExit("failover_bench: revision %d never reached the proxy"
                         % revision)

    def stop(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
                p.wait()


def main():
    if len(sys.argv) != 2 or not os.access(sys.argv[1], os.X_OK):
        print("usage: bench/failover_bench.py PATH/TO/openmesh", file=sys.stderr)
        return 2
    for tool in ("redis-server", "redis-cli"):
        if shutil.which(tool) is None:
            log("%s not found (scripts/deps installs it)" % tool)
            return 1
    tmp = tempfile.mkdtemp(prefix="om-failover-bench.")
    mesh = Mesh(os.path.abspath(sys.argv[1]), tmp)
    steady, steady2, failover = [], [], []
    n = 0
    try:
        mesh.start_redis()
        mesh.start_plane(0)
        mesh.start_plane(1)
        mesh.start_proxy()
        mesh.wait_snapshot(mesh.put(0, "seed"))

        def one_steady(out):
            nonlocal n
            n += 1
            used, _ = mesh.watched_plane()
            t0 = time.monotonic()
            rev = mesh.put(1 - used, "s%d" % n)
            out.append((mesh.wait_snapshot(rev) - t0) * 1000)

        def one_failover(out):
            nonlocal n
            n += 1
            used, _ = mesh.watched_plane()
            t0 = time.monotonic()
            mesh.kill_plane(used)
            rev = mesh.put(1 - used, "f%d" % n)
            out.append((mesh.wait_snapshot(rev) - t0) * 1000)
            mesh.start_plane(used)

        for r in range(ROUNDS + 1):
            s, s2, fo = ([], [], []) if r == 0 else (steady, steady2, failover)
            if r % 2 == 0:
                one_steady(s)
                one_steady(s2)
                one_failover(fo)
            else:
                one_failover(fo)
                one_steady(s)
                one_steady(s2)
            if r > 0:
                log("round %d: steady %.1f / %.1f ms, failover %.1f ms"
                    % (r, s[-1], s2[-1], fo[-1]))
    finally:
        mesh.stop()
        shutil.rmtree(tmp, ignore_errors=True)
    s50, s250, f50 = (statistics.median(x) for x in (steady, steady2, failover))
    print("watch_change_visible_steady_ms %.1f ms" % s50)
    print("watch_change_visible_after_failover_ms %.1f ms" % f50)
    print("watch_failover_vs_steady_ratio %.2f x" % (f50 / s50))
    print("watch_failover_aa_noise %.2f x" % (s250 / s50))
    return 0


if __name__ == "__main__":
    sys.exit(main())
