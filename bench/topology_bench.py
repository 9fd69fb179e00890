#!/usr/bin/python3
"""bench/topology_bench.py OPENMESH_BIN: what a big, busy topology costs
the calls a proxy serves (docs/BENCHMARKS.md "Topology changes").

One nginx upstream (`return 200 "ok"` on 16 loopback ports), one
`openmesh control` (memory store) holding service `bench` with 10,000
instances spread over those 16 URLs, one `openmesh proxy --control ...
--service bench` watching it. Latency at one connection through the proxy
is taken with bench/c1_client (a closed loop on one keep-alive connection)
in runs of two kinds, interleaved (quiet, churn, churn, quiet, ...):
  quiet  no change to the service;
  churn  a thread changes one instance's metadata 10 times a second
         (each change is a new revision, and the proxy receives the whole
         10,000-instance snapshot, as every watcher does).
Each kind's runs are pooled into one distribution (c1_client's quantile
files, each run weighted by its calls) and the figure is the pooled p99
of churn over the pooled p99 of quiet: the bar is <= 1.2. The run's own
A/A noise is the same ratio between the odd and the even quiet runs. The
proxy's CPU per change (its utime+stime over a churn run minus that over
the quiet run next to it, over the changes applied) goes to stderr.

Prints `name value (bar: ...)` lines; details go to stderr. Loopback
only, ports OM_BENCH_TOPO_PORT (19700) ..+20; every process it starts is
stopped by pid at the end. Environment: OM_BENCH_TOPO_ROUNDS (6 runs of
each kind), OM_BENCH_TOPO_DURATION (5 s per run), OM_BENCH_TOPO_PEERS
(10000), OM_BENCH_TOPO_RATE (10 changes/s). About 90 s.
"""
import http.client
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROUNDS = int(os.environ.get("OM_BENCH_TOPO_ROUNDS", "6"))
DURATION = float(os.environ.get("OM_BENCH_TOPO_DURATION", "5"))
PEERS = int(os.environ.get("OM_BENCH_TOPO_PEERS", "10000"))
RATE = float(os.environ.get("OM_BENCH_TOPO_RATE", "10"))
BASE = int(os.environ.get("OM_BENCH_TOPO_PORT", "19700"))
UP_PORTS = [BASE + 4 + i for i in range(16)]
CONTROL, LISTEN, ADMIN = BASE, BASE + 1, BASE + 2


def log(*a):
    print("topology_bench:", *a, file=sys.stderr)


def proc_cpu(pid):
    """utime + stime of pid and its threads, in seconds."""
    with open("/proc/%d/stat" % pid) as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def wait_for(what, check, timeout=30.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        try:
            if check():
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise SystemExit("topology_bench: timed out waiting for " + what)


def get_json(port, path):
    with urllib.request.urlopen("http://127.0.0.1:%d%s" % (port, path),
                                timeout=5) as r:
        return json.load(r)


class Registrar:
    """PUTs on one keep-alive connection to the control plane."""

    def __init__(self):
        self.conn = http.client.HTTPConnection("127.0.0.1", CONTROL,
                                               timeout=10)

    def put(self, i, version):
        body = json.dumps({
            "url": "http://127.0.0.1:%d" % UP_PORTS[i % len(UP_PORTS)],
            "ttl_ms": 3600000,
            "metadata": {"v": str(version)},
        })
        self.conn.request("PUT", "/v1/services/bench/instances/i-%d" % i,
                          body, {"Content-Type": "application/json"})
        r = self.conn.getresponse()
        data = r.read()
        if r.status != 200:
            raise SystemExit("topology_bench: PUT %d: %d %s" %
                             (i, r.status, data[:200]))
        return json.loads(data)["revision"]


def read_quantiles(path):
    with open(path) as f:
        lines = f.read().split()
    assert lines[0] == "n", "bad quantile file " + path
    return int(lines[1]), [int(x) for x in lines[2:]]


def pooled(runs, q):
    """The q quantile of runs pooled, each run's 10,000 quantile points
    standing for its calls."""
    pts = []
    for n, qs in runs:
        w = n / len(qs)
        pts.extend((v, w) for v in qs)
    pts.sort()
    total = sum(w for _, w in pts)
    acc = 0.0
    for v, w in pts:
        acc += w
        if acc >= q * total:
            return v
    return pts[-1][0]


def main():
    if len(sys.argv) != 2:
        raise SystemExit("usage: topology_bench.py OPENMESH_BIN")
    binary = os.path.abspath(sys.argv[1])
    c1 = os.path.join(os.path.dirname(binary), "..", "bench", "c1_client")
    if not os.access(c1, os.X_OK):
        raise SystemExit("topology_bench: no %s (make bench builds it)" % c1)
    tmp = tempfile.mkdtemp(prefix="om-topology.")
    procs = []

    def spawn(args, name):
        out = open(os.path.join(tmp, name + ".log"), "w")
        p = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT)
        procs.append(p)
        return p

    try:
        with open(os.path.join(tmp, "upstream.conf"), "w") as f:
            listens = "".join("    listen 127.0.0.1:%d;\n" % p
                              for p in UP_PORTS)
            f.write("""worker_processes 1;
pid {t}/up.pid;
error_log {t}/up.err warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  keepalive_timeout 300s;
  keepalive_requests 1000000000;
  client_body_temp_path {t}/b; proxy_temp_path {t}/p;
  fastcgi_temp_path {t}/f; uwsgi_temp_path {t}/u; scgi_temp_path {t}/s;
  server {{
{l}    location / {{ return 200 "ok"; }}
  }}
}}
""".format(t=tmp, l=listens))
        spawn(["nginx", "-c", os.path.join(tmp, "upstream.conf"), "-g",
               "daemon off;"], "upstream")
        spawn([binary, "control", "--listen", "127.0.0.1:%d" % CONTROL,
               "--max-watch-backlog", "1GiB", "--log-level", "warn"],
              "control")
        wait_for("the control plane", lambda: urllib.request.urlopen(
            "http://127.0.0.1:%d/healthz" % CONTROL, timeout=5).status == 200)
        reg = Registrar()
        t0 = time.monotonic()
        for i in range(PEERS):
            rev = reg.put(i, 0)
        log("registered %d instances in %.1f s (revision %d)" %
            (PEERS, time.monotonic() - t0, rev))
        proxy = spawn([binary, "proxy", "--control",
                       "http://127.0.0.1:%d" % CONTROL, "--service", "bench",
                       "--listen", "127.0.0.1:%d" % LISTEN, "--admin",
                       "127.0.0.1:%d" % ADMIN, "--log-level", "warn"],
                      "proxy")

        def revision():
            st = get_json(ADMIN, "/status")
            svc = st["services"].get("bench")
            if svc is None:  # no snapshot applied yet
                return 0, 0
            return svc.get("revision", 0), svc.get("peers_total",
                                                   len(svc.get("peers", [])))

        wait_for("the proxy's snapshot", lambda: revision()[0] >= rev, 60)
        log("proxy status:", revision())

        quiet, churn = [], []
        cpu_per_change = []
        version = [0]

        def run(kind, k):
            qfile = os.path.join(tmp, "q-%s-%d" % (kind, k))
            stop = threading.Event()
            applied = [0]

            def changer():
                r = Registrar()
                nxt = time.monotonic()
                while not stop.is_set():
                    version[0] += 1
                    r.put(version[0] % PEERS, version[0])
                    applied[0] += 1
                    nxt += 1.0 / RATE
                    d = nxt - time.monotonic()
                    if d > 0:
                        stop.wait(d)

            th = None
            cpu0 = proc_cpu(proxy.pid)
            if kind == "churn":
                th = threading.Thread(target=changer)
                th.start()
            subprocess.run([c1, str(LISTEN), str(DURATION), qfile],
                           check=True, stdout=subprocess.DEVNULL)
            if th is not None:
                stop.set()
                th.join()
            cpu = proc_cpu(proxy.pid) - cpu0
            n, qs = read_quantiles(qfile)
            log("%s run %d: %d calls, p50 %d us, p99 %d us, proxy cpu "
                "%.3f s, %d changes" % (kind, k, n, qs[4999], qs[9899], cpu,
                                        applied[0]))
            return (n, qs), cpu, applied[0]

        # one warm-up run of each kind
        run("quiet", -1)
        run("churn", -1)
        for k in range(ROUNDS):
            order = ["quiet", "churn"] if k % 2 == 0 else ["churn", "quiet"]
            res = {}
            for kind in order:
                res[kind] = run(kind, k)
            quiet.append(res["quiet"][0])
            churn.append(res["churn"][0])
            if res["churn"][2] > 0:
                cpu_per_change.append(
                    (res["churn"][1] - res["quiet"][1]) / res["churn"][2])
        p99_q = pooled(quiet, 0.99)
        p99_c = pooled(churn, 0.99)
        if len(quiet) < 2:
            raise SystemExit("topology_bench: OM_BENCH_TOPO_ROUNDS must be "
                             ">= 2 (the A/A pair)")
        aa = pooled(quiet[1::2], 0.99) / max(1, pooled(quiet[0::2], 0.99))
        cpu_per_change.sort()
        log("pooled p99: quiet %d us, churn %d us; A/A (odd/even quiet) %.2f"
            % (p99_q, p99_c, aa))
        if cpu_per_change:
            log("proxy CPU per change (median): %.1f ms" %
                (1e3 * cpu_per_change[len(cpu_per_change) // 2]))
        print("topology_churn_p99_us %d" % p99_c)
        print("topology_quiet_p99_us %d" % p99_q)
        print("topology_p99_churn_vs_quiet %.2f (bar: <= 1.2; A/A %.2f)" %
              (p99_c / max(1, p99_q), aa))
        # what the p99 cannot show: a change stalls about one call of a
        # closed loop (some 50 of 100,000 per run), so a stall of the
        # serving loop shows in the tail far above p99
        print("topology_churn_p9999_us %d" % pooled(churn, 0.9999))
        print("topology_quiet_p9999_us %d" % pooled(quiet, 0.9999))
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(timeout=3)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
