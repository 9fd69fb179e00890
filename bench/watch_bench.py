#!/usr/bin/env python3
"""bench/watch_bench.py OPENMESH_BIN [--quick]: what watches cost the
control plane (docs/BENCHMARKS.md "Watch fan-out and coalescing").

The real `openmesh control` binary (memory store, loopback, port 0 read
from its start log line), real HTTP clients on raw sockets in this
process (one selector loop: the watchers and the writer share it).

  watch_memory_per_watcher_bytes   2,000 watchers of a 100-instance service
      that never read; 300 updates of the service; (RSS after - RSS before
      the watchers connected) / 2,000. Bar: <= 16 KiB.
  fanout_10k_instances_100_watchers_p50_ms, _p99_ms   100 reading watchers
      of a 10,000-instance service (events of about 1.3 MB); one change at
      a time: from sending the PUT to the last watcher holding the new
      revision's event id. 30 changes after 2 of warm-up. Report. The cost
      of encoding that snapshot once is bench_watch_encode's
      watch_encode_10k_instances_ms.
  watch_10k_100_watchers_100_per_s_p99_ms   the same service and watchers,
      changes sent at 100/s for DURATION s (pipelined on one keep-alive
      connection, at most 16 unanswered), coalescing at its default
      (min_interval_ms=0: only a watcher whose output is still queued has
      its states replaced by the newest): for each change, the time until
      every watcher holds a revision at least that new; p99 over the
      changes. Bar: <= 250 ms, and no watcher cut
      (watch_10k_cut_watchers, bar 0).

The reading watchers are bench/watch_reader: one C process, one epoll
loop, the `id:` lines found with memchr (the 1.3 MB data line is skipped
at memory speed); it reports each event's id and arrival time
(CLOCK_MONOTONIC, the clock of time.monotonic) to this driver. It still
shares the machine: on a 2-core box the figures include its CPU (the
kernel's copy out of the socket, mostly). Prints one `name value unit` line per figure; details
on stderr. Environment: DURATION (default 5 s). --quick: 2 s, 10 changes.
"""
import json
import os
import re
import selectors
import socket
import subprocess
import sys
import tempfile
import time

BIN = sys.argv[1] if len(sys.argv) > 1 else None
QUICK = "--quick" in sys.argv
DURATION = 2.0 if QUICK else float(os.environ.get("DURATION", "5"))
N_FANOUT = 10 if QUICK else 30


def log(*a):
    print("watch_bench:", *a, file=sys.stderr, flush=True)


def report(name, value, unit, bar=None):
    line = "%s %.2f %s" % (name, value, unit)
    if bar:
        line += " (bar: %s)" % bar
    print(line, flush=True)


class Plane:
    def __init__(self, args=()):
        self.dir = tempfile.mkdtemp(prefix="om-watch-bench.")
        self.err = open(os.path.join(self.dir, "control.log"), "w+")
        self.p = subprocess.Popen(
            [BIN, "control", "--listen", "127.0.0.1:0", "--log-level", "warn"]
            + list(args), stdout=self.err, stderr=subprocess.STDOUT)
        # warn hides the start line: ask the kernel which port it bound
        deadline = time.monotonic() + 10
        self.port = None
        while self.port is None and time.monotonic() < deadline:
            if self.p.poll() is not None:
                raise SystemExit("watch_bench: control exited: %s" % self.log())
            self.port = self._port()
            if self.port is None:
                time.sleep(0.02)
        if self.port is None:
            raise SystemExit("watch_bench: control did not listen")

    def _port(self):
        ino = set()
        for fd in os.listdir("/proc/%d/fd" % self.p.pid):
            try:
                t = os.readlink("/proc/%d/fd/%s" % (self.p.pid, fd))
            except OSError:
                continue
            m = re.match(r"socket:\[(\d+)\]", t)
            if m:
                ino.add(m.group(1))
        with open("/proc/net/tcp") as f:
            for line in f.readlines()[1:]:
                c = line.split()
                if c[3] == "0A" and c[9] in ino:
                    return int(c[1].split(":")[1], 16)
        return None

    def log(self):
        self.err.flush()
        with open(self.err.name) as f:
            return f.read()[-2000:]

    def rss(self):
        with open("/proc/%d/status" % self.p.pid) as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        return 0

    def stop(self):
        self.p.terminate()
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            self.p.kill()
            self.p.wait()
        self.err.close()
        subprocess.call(["rm", "-rf", self.dir])


class Client:
    """One keep-alive HTTP/1.1 connection, one request at a time."""

    def __init__(self, port):
        self.s = socket.create_connection(("127.0.0.1", port), timeout=30)
        self.buf = b""

    def send(self, method, path, body=b""):
        self.s.sendall(("%s %s HTTP/1.1\r\nHost: b\r\nContent-Length: %d\r\n\r\n"
                        % (method, path, len(body))).encode() + body)

    def poll(self):
        """The answer (status, body) if complete in what was read, else
        None; reads what the socket has without blocking."""
        self.s.setblocking(False)
        try:
            while True:
                b = self.s.recv(65536)
                if not b:
                    raise SystemExit("watch_bench: the plane closed a client")
                self.buf += b
        except BlockingIOError:
            pass
        finally:
            self.s.setblocking(True)
        return self._take()

    def _take(self):
        i = self.buf.find(b"\r\n\r\n")
        if i < 0:
            return None
        head = self.buf[:i].decode()
        n = int(re.search(r"(?i)content-length: *(\d+)", head).group(1))
        if len(self.buf) < i + 4 + n:
            return None
        body = self.buf[i + 4:i + 4 + n]
        self.buf = self.buf[i + 4 + n:]
        return int(head.split(" ")[1]), body

    def request(self, method, path, body=b""):
        self.send(method, path, body)
        while True:
            r = self._take()
            if r is not None:
                return r
            b = self.s.recv(65536)
            if not b:
                raise SystemExit("watch_bench: the plane closed a client")
            self.buf += b


def instance(i, n=0):
    return json.dumps({"url": "http://127.1.%d.%d:8080" % (i // 250, i % 250 + 1),
                       "ttl_ms": 3600000, "zone": "eu-1",
                       "metadata": {"version": "v1", "n": str(n)}}).encode()


def put(c, svc, i, n=0):
    st, body = c.request("PUT", "/v1/services/%s/instances/inst-%05d" % (svc, i),
                         instance(i, n))
    if st != 200:
        raise SystemExit("watch_bench: PUT answered %d %s" % (st, body[:200]))
    return json.loads(body)["revision"]


class Watcher:
    def __init__(self, port, svc, query="", read=True):
        self.s = socket.create_connection(("127.0.0.1", port))
        path = "/v1/watch/services/" + svc + ("?" + query if query else "")
        self.s.sendall(("GET %s HTTP/1.1\r\nHost: b\r\n\r\n" % path).encode())
        self.s.setblocking(False)
        self.carry = b""
        self.ids = []    # event ids in order
        self.times = []  # when each arrived
        self.eof = False

    def feed(self, now):
        try:
            chunk = self.s.recv(1 << 20)
        except BlockingIOError:
            return
        except ConnectionError:
            chunk = b""
        if not chunk:
            self.eof = True
            return
        data = self.carry + chunk
        k = len(self.carry)
        i = data.find(b"\nid: ")
        while i >= 0:
            j = data.find(b"\n", i + 5)
            if j < 0:
                break
            if j >= k:  # a line inside the old carry was counted then
                self.ids.append(int(data[i + 5:j]))
                self.times.append(now)
            i = data.find(b"\nid: ", j)
        self.carry = data[-48:]

    def last(self):
        return self.ids[-1] if self.ids else 0


class Readers:
    """The reading watchers of bench_fanout: bench/watch_reader (one C
    process, one epoll loop) reads every stream and reports each event id
    with its arrival time, so the readers cost the shared machine a memchr
    over the bytes, not a Python copy of them."""

    class W:
        def __init__(self):
            self.ids, self.times, self.eof = [], [], False

        def last(self):
            return self.ids[-1] if self.ids else 0

    def __init__(self, port, path, n):
        exe = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(BIN))),
                           "bench", "watch_reader")
        self.p = subprocess.Popen([exe, str(port), path, str(n)],
                                  stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.ws = [Readers.W() for _ in range(n)]
        self.carry = b""
        os.set_blocking(self.p.stdout.fileno(), False)
        self.ready = False

    def feed(self, now):
        try:
            b = os.read(self.p.stdout.fileno(), 1 << 16)
        except BlockingIOError:
            return
        if not b:
            raise SystemExit("watch_bench: watch_reader exited %s" % self.p.wait())
        lines = (self.carry + b).split(b"\n")
        self.carry = lines.pop()
        for line in lines:
            f = line.split()
            if f[0] == b"ev":
                w = self.ws[int(f[1])]
                w.ids.append(int(f[2]))
                w.times.append(float(f[3]))
            elif f[0] == b"eof":
                self.ws[int(f[1])].eof = True
            elif f[0] == b"ready":
                self.ready = True

    def close(self):
        self.p.stdin.close()
        self.p.wait(10)


def pump(sel, t):
    now = time.monotonic()
    for key, _ in sel.select(t):
        key.data.feed(now)


def metric(c, name):
    st, body = c.request("GET", "/metrics")
    m = re.search(re.escape(name) + r" (\d+)", body.decode())
    return int(m.group(1)) if m else 0


def bench_memory():
    plane = Plane()
    try:
        c = Client(plane.port)
        for i in range(100):
            put(c, "mem", i)
        time.sleep(0.3)
        before = plane.rss()
        ws = [Watcher(plane.port, "mem") for _ in range(2000)]
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            st, body = c.request("GET", "/status")
            if json.loads(body)["watchers"] >= 2000:
                break
            time.sleep(0.05)
        else:
            raise SystemExit("watch_bench: 2,000 watchers did not connect")
        rev = 0
        for n in range(300):
            rev = put(c, "mem", n % 100, n + 1)
        time.sleep(0.5)
        after = plane.rss()
        st, body = c.request("GET", "/status")
        dropped = metric(c, 'openmesh_control_watchers_dropped_total{reason="backlog"}')
        log("memory: RSS %.1f MB before, %.1f MB after 2,000 watchers and 300 "
            "updates (revision %d), %d watchers, %d cut"
            % (before / 1e6, after / 1e6, rev, json.loads(body)["watchers"], dropped))
        report("watch_memory_per_watcher_bytes", (after - before) / 2000.0, "B",
               "<= 16384")
        for w in ws:
            w.s.close()
    finally:
        plane.stop()


def percentile(v, p):
    v = sorted(v)
    return v[min(len(v) - 1, int(round(p / 100.0 * (len(v) - 1))))]


def bench_fanout():
    plane = Plane()
    try:
        c = Client(plane.port)
        t0 = time.monotonic()
        for i in range(10000):
            put(c, "big", i)
        log("fanout: 10,000 instances registered in %.1f s" % (time.monotonic() - t0))
        sel = selectors.DefaultSelector()
        readers = Readers(plane.port, "/v1/watch/services/big", 100)
        sel.register(readers.p.stdout, selectors.EVENT_READ, readers)
        ws = readers.ws
        deadline = time.monotonic() + 60
        while any(not w.ids for w in ws) and time.monotonic() < deadline:
            pump(sel, 0.1)
        if any(not w.ids for w in ws):
            raise SystemExit("watch_bench: watchers got no first snapshot")
        # one change at a time
        lat = []
        for n in range(N_FANOUT + 2):
            t = time.monotonic()
            rev = put(c, "big", (n * 37) % 10000, n + 1)
            deadline = t + 30
            while any(w.last() < rev for w in ws) and time.monotonic() < deadline:
                pump(sel, 0.05)
            if any(w.last() < rev for w in ws):
                raise SystemExit("watch_bench: a watcher never got revision %d" % rev)
            if n >= 2:
                lat.append((max(w.times[-1] for w in ws) - t) * 1000)
        report("fanout_10k_instances_100_watchers_p50_ms", percentile(lat, 50), "ms")
        report("fanout_10k_instances_100_watchers_p99_ms", percentile(lat, 99), "ms")
        # 100 changes/s, coalescing at its default
        sched = []  # (sent, revision)
        w_sock = Client(plane.port)
        start = time.monotonic()
        n = 0
        inflight = []  # send times of PUTs not answered yet (pipelined)
        while time.monotonic() - start < DURATION or inflight:
            now = time.monotonic()
            if (now - start < DURATION and now >= start + n / 100.0
                    and len(inflight) < 16):
                w_sock.send("PUT", "/v1/services/big/instances/inst-%05d" % (n * 53 % 10000),
                            instance(n * 53 % 10000, 1000 + n))
                inflight.append(now)
                n += 1
            if inflight:
                r = w_sock.poll()
                while r is not None:
                    sched.append((inflight.pop(0), json.loads(r[1])["revision"]))
                    r = w_sock._take() if inflight else None
            nxt = start + n / 100.0
            pump(sel, max(0.0, min(0.005, nxt - time.monotonic())))
        last = sched[-1][1]
        deadline = time.monotonic() + 30
        while any(w.last() < last for w in ws) and time.monotonic() < deadline:
            pump(sel, 0.05)
        lat = []
        for sent, rev in sched:
            worst = 0.0
            for w in ws:
                # the first event at least that new
                at = next((tm for i, tm in zip(w.ids, w.times) if i >= rev), None)
                if at is None:
                    worst = float("inf")
                    break
                worst = max(worst, at - sent)
            lat.append(worst * 1000)
        cut = metric(c, 'openmesh_control_watchers_dropped_total{reason="backlog"}')
        cut += sum(1 for w in ws if w.eof)
        events = sum(len(w.ids) for w in ws)
        log("100/s: %d changes in %.1f s (%.0f/s), %d events to 100 watchers, "
            "p50 %.0f ms" % (len(sched), DURATION, len(sched) / DURATION, events,
                            percentile(lat, 50)))
        report("watch_10k_100_watchers_100_per_s_p99_ms", percentile(lat, 99), "ms",
               "<= 250")
        report("watch_10k_changes_per_s", len(sched) / DURATION, "changes/s")
        report("watch_10k_cut_watchers", cut, "watchers", "0")
        readers.close()
    finally:
        plane.stop()


def main():
    if not BIN:
        raise SystemExit("usage: watch_bench.py OPENMESH_BIN [--quick]")
    import resource
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 4096:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4096), hard))
    bench_memory()
    bench_fanout()


if __name__ == "__main__":
    main()
