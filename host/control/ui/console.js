// console.js: the control plane's console (docs/CONTROL.md, "Console").
//
// Fed by the plane's own read API, as a proxy is: one EventSource on
// /v1/watch/services (every service's snapshot, pushed on each change),
// and once a second /status, /readyz, /v1/leases (renewals move no
// revision, so no snapshot says when a lease runs out) and each
// document's /v1/config/NAME/status (those have no watch). One stream, not one per
// document: a browser keeps at most six connections to an origin.
//
// Every value from the plane reaches the page as a text node or through
// setAttribute, never as markup: names, zones, metadata and a proxy's
// refusal reason are the operators' and the proxies' words, not ours.
"use strict";

(function () {
  const TOKEN_KEY = "openmesh.console.token";
  const POLL_MS = 1000;
  const TICK_MS = 250;

  const state = {
    token: null,
    services: new Map(), // name -> snapshot
    leases: new Map(), // "service/id" -> {left: ms, at: Date.now() of the answer}
    leasesError: null,
    status: null,
    ready: null,
    docs: [], // [{doc, status}] from the last poll
    es: null,
    stream: "connecting",
    polling: false,
    lastEvent: null,
  };

  const $ = (id) => document.getElementById(id);
  let pollTimer = null;
  let tickTimer = null;

  // An element with a class and children: strings and numbers become text.
  function el(tag, cls, ...children) {
    const e = document.createElement(tag);
    if (cls) e.className = cls;
    for (const c of children) {
      if (c === null || c === undefined) continue;
      e.appendChild(typeof c === "object" ? c : document.createTextNode(String(c)));
    }
    return e;
  }

  function row(cells, tag) {
    const tr = el("tr");
    for (const c of cells) tr.appendChild(el(tag || "td", null, c));
    return tr;
  }

  function table(head, rows) {
    const t = el("table");
    t.appendChild(el("thead", null, row(head, "th")));
    const tb = el("tbody");
    for (const r of rows) tb.appendChild(r);
    t.appendChild(tb);
    return t;
  }

  function seconds(ms) {
    const s = Math.max(0, ms) / 1000;
    return s < 10 ? s.toFixed(1) + " s" : Math.round(s) + " s";
  }

  function when(unixS) {
    if (typeof unixS !== "number") return "";
    return new Date(unixS * 1000).toISOString().replace("T", " ").replace(/\.\d+Z$/, "Z");
  }

  // ---- the token ----

  // The token from ?access_token= (then taken out of the address bar and
  // kept for this tab only), else the one this tab was given before.
  function takeToken() {
    const u = new URL(location.href);
    const t = u.searchParams.get("access_token");
    if (t !== null) {
      if (t !== "") sessionStorage.setItem(TOKEN_KEY, t);
      u.searchParams.delete("access_token");
      history.replaceState(null, "", u.pathname + u.search + u.hash);
    }
    return sessionStorage.getItem(TOKEN_KEY);
  }

  function headers() {
    return state.token ? { Authorization: "Bearer " + state.token } : {};
  }

  // EventSource cannot send headers: the read role takes the token in the URL.
  function withToken(path) {
    return state.token ? path + "?access_token=" + encodeURIComponent(state.token) : path;
  }

  function askToken(why) {
    stopAll(true);
    setStream("unauthorized");
    $("main").hidden = true;
    $("login").hidden = false;
    $("login-why").textContent = why;
    $("token").focus();
  }

  $("login").addEventListener("submit", (e) => {
    e.preventDefault();
    const t = $("token").value.trim();
    $("token").value = "";
    if (t === "") return;
    state.token = t;
    sessionStorage.setItem(TOKEN_KEY, t);
    start();
  });

  // ---- talking to the plane ----

  class HttpError extends Error {
    constructor(status, body) {
      super((body && body.message) || "HTTP " + status);
      this.status = status;
    }
  }

  // JSON from path; a 503 of /readyz is an answer too (ok503).
  async function getJSON(path, ok503) {
    const r = await fetch(path, { headers: headers(), cache: "no-store" });
    let body = null;
    try {
      body = await r.json();
    } catch (_) {
      body = null;
    }
    if (r.ok || (ok503 && r.status === 503)) return body;
    throw new HttpError(r.status, body);
  }

  function authProblem(err) {
    if (!(err instanceof HttpError)) return false;
    // already asking: a poll sent before keeps the first reason shown
    if ((err.status === 401 || err.status === 403) && !$("login").hidden) return true;
    if (err.status === 401) {
      sessionStorage.removeItem(TOKEN_KEY);
      askToken(state.token ? "The token was refused." : "This plane needs a token.");
      state.token = null;
      return true;
    }
    if (err.status === 403) {
      askToken("The token lacks the read role.");
      return true;
    }
    return false;
  }

  function setStream(s) {
    state.stream = s;
    const b = $("stream");
    b.dataset.state = s;
    b.textContent = s;
  }

  // Close the stream; with polls too, when the page has lost its token.
  function stopAll(all) {
    if (state.es) state.es.close();
    state.es = null;
    if (all) {
      clearInterval(pollTimer);
      clearInterval(tickTimer);
      pollTimer = tickTimer = null;
    }
  }

  function openStream() {
    stopAll();
    const es = new EventSource(withToken("/v1/watch/services"));
    state.es = es;
    es.onopen = () => setStream("live");
    es.addEventListener("snapshot", (e) => {
      let s;
      try {
        s = JSON.parse(e.data);
      } catch (_) {
        return;
      }
      if (!s || typeof s.service !== "string") return;
      state.services.set(s.service, s);
      state.lastEvent = Date.now();
      setStream("live");
      renderServices();
    });
    es.addEventListener("revoked", () => {
      es.close();
      sessionStorage.removeItem(TOKEN_KEY);
      state.token = null;
      askToken("The token of this stream was revoked.");
    });
    es.onerror = () => {
      if (state.es !== es) return;
      if (es.readyState === EventSource.CLOSED) {
        // refused (401, 403, 5xx): no retry of its own; ask /status why
        setStream("closed");
        state.es = null;
        setTimeout(start, 2000);
      } else {
        setStream("reconnecting");
      }
    };
  }

  async function poll() {
    if (state.polling) return;
    state.polling = true;
    try {
      const [st, rd, ls] = await Promise.all([
        getJSON("/status"),
        getJSON("/readyz", true),
        getJSON("/v1/leases").catch((err) => {
          if (err instanceof HttpError && (err.status === 401 || err.status === 403)) throw err;
          return { error: err.message || String(err) };
        }),
      ]);
      state.status = st;
      state.ready = rd;
      const at = Date.now();
      state.leases = new Map();
      state.leasesError = ls && Array.isArray(ls.leases) ? null : (ls && ls.error) || "no answer";
      if (state.leasesError === null)
        for (const l of ls.leases) state.leases.set(l.service + "/" + l.id, { left: l.expires_in_ms, at });
      const docs = Array.isArray(st && st.config) ? st.config : [];
      state.docs = await Promise.all(
        docs.map((d) =>
          getJSON("/v1/config/" + encodeURIComponent(d.name) + "/status").then(
            (status) => ({ doc: d, status }),
            (err) => ({ doc: d, status: null, error: err.message }),
          ),
        ),
      );
      renderPlane();
      renderConfig();
      tick();
    } catch (err) {
      if (!authProblem(err)) {
        state.status = null;
        state.pollError = err.message || String(err);
        renderPlane();
      }
    } finally {
      state.polling = false;
    }
  }

  async function start() {
    state.token = state.token || takeToken();
    try {
      await getJSON("/status");
    } catch (err) {
      if (authProblem(err)) return;
      setStream("closed");
      setTimeout(start, 2000);
      return;
    }
    $("login").hidden = true;
    $("main").hidden = false;
    openStream();
    poll();
    if (pollTimer === null) pollTimer = setInterval(poll, POLL_MS);
    if (tickTimer === null) tickTimer = setInterval(tick, TICK_MS);
  }

  // ---- rendering ----

  function renderPlane() {
    const dl = $("plane");
    const items = [];
    const st = state.status;
    if (st === null) {
      items.push(["plane", el("span", "bad", "unreachable: " + (state.pollError || "no answer"))]);
    } else {
      const ready = state.ready;
      const reasons = ready && Array.isArray(ready.reasons) ? ready.reasons.join(", ") : "";
      items.push(["ready", ready && ready.ready ? el("span", "good", "yes") : el("span", "bad", "no (" + reasons + ")")]);
      items.push(["store", st.store]);
      items.push(["stale", st.stale ? el("span", "bad", "yes: serving the last known state, writes refused") : "no"]);
      if ("warming" in st) items.push(["warming", st.warming ? el("span", "bad", "yes") : "no"]);
      items.push(["revision", st.revision]);
      items.push(["services", st.services]);
      items.push(["instances", st.instances]);
      items.push(["watchers", st.watchers]);
      items.push(["uptime", typeof st.uptime_s === "number" ? seconds(st.uptime_s * 1000) : ""]);
      items.push(["auth", st.auth ? "tokens" : "off"]);
      items.push(["registrations / renewals / deletions / expiries", [st.registrations, st.renewals, st.deletions, st.expiries].join(" / ")]);
      // anything else the plane reports, as it reports it
      const known = new Set(["store", "stale", "warming", "revision", "services", "instances", "watchers", "uptime_s", "auth", "registrations", "renewals", "deletions", "expiries", "config"]);
      for (const k of Object.keys(st)) {
        if (known.has(k)) continue;
        const v = st[k];
        items.push([k, typeof v === "object" ? JSON.stringify(v) : String(v)]);
      }
    }
    items.push(["stream", state.stream + (state.lastEvent ? ", last event " + seconds(Date.now() - state.lastEvent) + " ago" : "")]);
    dl.replaceChildren();
    for (const [k, v] of items) {
      dl.appendChild(el("dt", null, k));
      dl.appendChild(el("dd", null, v));
    }
  }

  function metadataCell(md) {
    const span = el("span");
    if (!md || typeof md !== "object") return span;
    for (const k of Object.keys(md).sort()) span.appendChild(el("span", "meta", k + "=" + md[k]));
    return span;
  }

  function renderServices() {
    const box = $("services");
    const names = Array.from(state.services.keys()).sort();
    box.replaceChildren();
    if (names.length === 0) {
      box.appendChild(el("p", "empty", "no service yet"));
      return;
    }
    for (const name of names) {
      const s = state.services.get(name);
      const insts = Array.isArray(s.instances) ? s.instances : [];
      const sec = el("div", "service");
      sec.setAttribute("data-service", name);
      sec.appendChild(el("h3", null, name + " ", el("span", "rev", "revision " + s.revision + ", " + insts.length + " instance" + (insts.length === 1 ? "" : "s"))));
      const rows = [];
      for (const i of insts) {
        const key = name + "/" + i.id;
        const lease = el("span", "lease");
        lease.setAttribute("data-ttl-ms", String(i.ttl_ms));
        lease.setAttribute("data-key", key);
        const tr = row([i.id, i.url, i.zone === null || i.zone === undefined ? "" : i.zone, i.weight, metadataCell(i.metadata), lease]);
        tr.setAttribute("data-instance", key);
        rows.push(tr);
      }
      if (rows.length > 0) sec.appendChild(table(["id", "url", "zone", "weight", "metadata", "lease"], rows));
      else sec.appendChild(el("p", "empty", "no instance"));
      box.appendChild(sec);
    }
    tick();
  }

  // The live part: each lease's time left, counted down from the plane's
  // last answer (re-read every second), out of its ttl.
  function tick() {
    const now = Date.now();
    for (const cell of document.querySelectorAll("span.lease")) {
      const ttl = Number(cell.getAttribute("data-ttl-ms"));
      const l = state.leases.get(cell.getAttribute("data-key"));
      if (!l) {
        cell.textContent = "ttl " + seconds(ttl) + (state.leasesError ? " (time left unknown: " + state.leasesError + ")" : "");
        cell.removeAttribute("data-left-ms");
        continue;
      }
      const left = Math.max(0, l.left - (now - l.at));
      cell.setAttribute("data-left-ms", String(Math.round(left)));
      cell.textContent = seconds(left) + " left of " + seconds(ttl);
      cell.className = left < ttl / 4 ? "lease expiring" : "lease";
    }
  }

  function renderConfig() {
    const box = $("config");
    box.replaceChildren();
    if (state.docs.length === 0) {
      box.appendChild(el("p", "empty", "no document yet"));
      return;
    }
    for (const { doc, status, error } of state.docs) {
      const sec = el("div", "doc");
      sec.setAttribute("data-doc", doc.name);
      sec.appendChild(el("h3", null, doc.name + " ", el("span", "rev", "revision " + doc.revision + ", " + doc.content_type)));
      if (status === null) {
        sec.appendChild(el("p", "bad", "status: " + error));
      } else if (!Array.isArray(status.proxies) || status.proxies.length === 0) {
        sec.appendChild(el("p", "empty", "no proxy reported"));
      } else {
        const rows = status.proxies.map((p) => {
          const applied = p.applied === null ? "none" : String(p.applied) + (p.applied === doc.revision ? " (current)" : "");
          const refused = p.refused === null ? "" : el("span", "bad", String(p.refused));
          const tr = row([p.id, p.address, applied, refused, p.reason === null ? "" : p.reason, typeof p.age_s === "number" ? seconds(p.age_s * 1000) + " ago" : ""]);
          tr.setAttribute("data-proxy", doc.name + "/" + p.id);
          return tr;
        });
        sec.appendChild(table(["proxy", "address", "applied", "refused", "reason", "last report"], rows));
      }
      box.appendChild(sec);
    }
  }

  start();
})();
