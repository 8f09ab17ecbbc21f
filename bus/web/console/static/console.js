// The bus console: one stream of the whole system's state (/api/v1/stream), drawn as it
// comes; no page reloads, no libraries. Streams are read with fetch() so that the bearer
// token (when the server wants one) travels in the Authorization header.
"use strict";

const HISTORY = 300;      // points per chart (one a second: five minutes)
const TAIL_ROWS = 200;    // rows the tail keeps on the page
const TOKEN_KEY = "bus-console-token";
const NAMES = {eventbus: "Event BUS", emqp: "eMQP", "emqp-pubsub": "eMQP pub/sub", mc0: "mc0",
               dbp: "DBP catalog", zre: "ZRE", "spark-bridge": "Spark bridge", http: "HTTP"};
const KNOWN_VIEWS = new Set(["eventbus", "emqp", "emqp-pubsub", "mc0", "dbp", "zre", "spark-bridge"]);
// As the shipped alert rules have it (docs/prometheus/alerts.yml): a stream or a queue's
// consumer without a leader is critical (red); a replica not current, or more operations
// behind its leader than this, is a warning (amber).
const REPLICA_LAG_WARN = 10000;

const PAST_POINTS = 600;  // points per chart asked of the stored past
const $ = (id) => document.getElementById(id);
const history = {};       // service -> label -> [[t, rate], ...], live (one a second)
// The rates the server kept (/api/v1/history): service -> label -> [[t, rate], ...], drawn
// before the live ones; each point the mean of `past.step` seconds.
const past = {series: {}, step: 0, span: 0, loaded: false};
let pastTimer = null;
let stateStream = null;
let tailStream = null;

function headers() {
  const token = sessionStorage.getItem(TOKEN_KEY);
  return token ? {Authorization: "Bearer " + token} : {};
}

// Reads Server-Sent Events from `path`, calling onEvent(name, data) for each; resolves
// when the stream ends. Rejects with {status} when the server refuses.
async function stream(path, onEvent, controller) {
  const response = await fetch(path, {headers: headers(), signal: controller.signal, cache: "no-store"});
  if (!response.ok) {
    let detail = "";
    try { detail = (await response.json()).error || ""; } catch (e) { /* not JSON */ }
    throw {status: response.status, detail};
  }
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const {value, done} = await reader.read();
    if (done) return;
    buffer += decoder.decode(value, {stream: true});
    let cut;
    while ((cut = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, cut);
      buffer = buffer.slice(cut + 2);
      let name = "message", data = "";
      for (const line of block.split("\n")) {
        if (line.startsWith("event: ")) name = line.slice(7);
        else if (line.startsWith("data: ")) data += line.slice(6);
      }
      if (data) onEvent(name, JSON.parse(data));
    }
  }
}

// -- the state stream -------------------------------------------------------------------

function connect() {
  const controller = new AbortController();
  stateStream = controller;
  stream("/api/v1/stream", onStateEvent, controller)
    .then(() => lost("the server ended the stream"))
    .catch((error) => {
      if (controller.signal.aborted) return;
      if (error && error.status === 401) return askToken("the token was refused");
      lost(error && error.status ? "HTTP " + error.status : "cannot reach the server");
    });
}

function lost(why) {
  const link = $("link");
  link.textContent = "disconnected: " + why + "; retrying";
  link.className = "link down";
  setTimeout(connect, 2000);
}

function askToken(why) {
  $("console").hidden = true;
  $("token-form").hidden = false;
  $("token-error").textContent = sessionStorage.getItem(TOKEN_KEY) ? why : "";
  $("link").textContent = "token needed";
  $("link").className = "link down";
}

function onStateEvent(name, data) {
  if (name === "history") {
    for (const sample of data) addRates(sample.t, sample.rates);
  } else if (name === "state") {
    $("token-form").hidden = true;
    $("console").hidden = false;
    $("link").textContent = "live";
    $("link").className = "link up";
    if (data.t !== undefined) {
      const rates = {};
      for (const s of data.services) rates[s.name] = s.rates;
      addRates(data.t, rates);
    }
    render(data);
  }
}

function addRates(t, rates) {
  for (const [service, values] of Object.entries(rates)) {
    const labels = history[service] || (history[service] = {});
    for (const [label, value] of Object.entries(values)) {
      const points = labels[label] || (labels[label] = []);
      if (points.length && points[points.length - 1][0] >= t) continue;
      points.push([t, value]);
      if (points.length > HISTORY) points.splice(0, points.length - HISTORY);
    }
  }
}

// -- drawing ----------------------------------------------------------------------------

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (k === "class") node.className = v; else node.setAttribute(k, v);
  }
  for (const child of children) {
    if (child === null || child === undefined) continue;
    node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function rate(value) {
  if (value === undefined || value === null) return "–";
  if (value >= 10000) return Math.round(value / 1000) + "k/s";
  if (value >= 100) return Math.round(value) + "/s";
  return (Math.round(value * 10) / 10) + "/s";
}

function duration(seconds) {
  if (seconds === undefined || seconds === null) return "–";
  seconds = Math.max(0, seconds);
  if (seconds < 60) return seconds.toFixed(seconds < 10 ? 1 : 0) + " s";
  if (seconds < 3600) return Math.floor(seconds / 60) + " min " + Math.floor(seconds % 60) + " s";
  if (seconds < 86400) return Math.floor(seconds / 3600) + " h " + Math.floor(seconds % 3600 / 60) + " min";
  return Math.floor(seconds / 86400) + " d " + Math.floor(seconds % 86400 / 3600) + " h";
}

// What a schedule runs: eventmq's path and callable, else the first bytes of its body.
function scheduleJob(s) {
  if (s.path) return s.callable ? s.path + " " + s.callable : s.path;
  return s.body === undefined || s.body === null ? "–" : s.body;
}

function span() {
  return Number($("span").value) || 3600;
}

// The stored past of the chosen span; then every minute (or every step, when coarser)
// its newest part again, at the same step, so that it goes on where the live points (the
// last HISTORY seconds) end. The server's buckets follow its clock: a bucket asked again
// replaces the one the page has.
async function loadPast(event) {
  clearTimeout(pastTimer);
  const wanted = span();
  const whole = event !== "refresh" || !past.loaded || past.span !== wanted;
  let query = "range=" + wanted + "&points=" + PAST_POINTS;
  let since = 0;
  if (!whole) {
    let last = 0;
    for (const labels of Object.values(past.series)) {
      for (const points of Object.values(labels)) if (points.length) last = Math.max(last, points[points.length - 1][0]);
    }
    since = last ? Math.floor(last / past.step) * past.step : Date.now() / 1000 - wanted;
    query = "from=" + since + "&step=" + past.step + "&points=10000";
  }
  try {
    const response = await fetch("/api/v1/history?" + query, {headers: headers(), cache: "no-store"});
    if (response.ok && wanted === span()) {
      const answer = await response.json();
      if (whole) {
        Object.assign(past, {series: answer.series, step: answer.step, span: wanted, loaded: true});
      } else {
        const start = Date.now() / 1000 - wanted;
        for (const [service, labels] of Object.entries(answer.series)) {
          const mine = past.series[service] || (past.series[service] = {});
          for (const [label, points] of Object.entries(labels)) {
            const kept = (mine[label] || []).filter((p) => p[0] < since && p[0] >= start);
            mine[label] = kept.concat(points);
          }
        }
      }
    }
  } catch (e) { /* the server is away: the stream says so */ }
  pastTimer = setTimeout(() => loadPast("refresh"), 1000 * Math.max(60, past.step || 0));
}

// A chart's points: the past before the first live point, then the live ones.
function chartPoints(service, label) {
  const live = (history[service] || {})[label] || [];
  const stored = (past.series[service] || {})[label] || [];
  const cut = live.length ? live[0][0] : Infinity;
  const before = stored.filter((p) => p[0] < cut);
  return {points: before.concat(live), stored: before.length};
}

// Every label charted for a service, live or stored.
function chartLabels(service) {
  return [...new Set([...Object.keys(history[service] || {}), ...Object.keys(past.series[service] || {})])];
}

function spark(points, cls, now, stored) {
  const svg = document.createElementNS("http://www.w3.org/2000/svg", "svg");
  svg.setAttribute("class", "spark");
  svg.setAttribute("viewBox", "0 0 300 34");
  svg.setAttribute("preserveAspectRatio", "none");
  if (!points || !points.length) return svg;
  // The x axis spans the chosen span (or what there is of it), ending now.
  const start = Math.max(now - span(), points[0][0]);
  const shown = points.filter((p) => p[0] >= start);
  if (!shown.length) return svg;
  const width = Math.max(1, now - start);
  const max = Math.max(1, ...shown.map((p) => p[1]));
  // A line per run: where points are further apart than a step (the server or the page
  // was away), the chart shows a gap.
  const gap = Math.max(3, 2.5 * (past.step || 0));
  let run = [];
  const runs = [run];
  for (let i = 0; i < shown.length; i++) {
    if (i && shown[i][0] - shown[i - 1][0] > gap) runs.push(run = []);
    run.push(shown[i]);
  }
  const title = document.createElementNS("http://www.w3.org/2000/svg", "title");
  title.textContent = "peak " + rate(Math.max(...shown.map((p) => p[1]))) + " over the last " + duration(width);
  svg.append(title);
  for (const points of runs) {
    const line = document.createElementNS("http://www.w3.org/2000/svg", "polyline");
    // A run of one point is drawn as a dot's width.
    const xy = points.map((p) => [300 * (p[0] - start) / width, 32 - 30 * p[1] / max]);
    if (xy.length === 1) xy.push([xy[0][0] + 1, xy[0][1]]);
    line.setAttribute("points", xy.map(([x, y]) => x.toFixed(1) + "," + y.toFixed(1)).join(" "));
    if (cls) line.setAttribute("class", cls);
    svg.append(line);
  }
  // How many of its points are the stored past (what tests and curious operators read).
  svg.setAttribute("data-past", String(points.slice(0, stored || 0).filter((p) => p[0] >= start).length));
  svg.setAttribute("data-from", String(shown[0][0]));
  return svg;
}

function emqpStore(js) {
  // The SQLite file, or the JetStream stream several brokers share (docs/cluster.md).
  if (!js) return "sqlite";
  const where = js.connected ? "via " + js.server : "NATS not reachable";
  return "jetstream " + js.stream + " (R" + js.replicas + "), broker " + js.broker_id + ", " + where;
}

function problems(s) {
  const status = s.status || {};
  const out = [];
  if (status.storage_error) out.push("storage: " + status.storage_error);
  if (status.collector_paused) out.push("collector paused (storage)");
  if (status.client_port_paused) out.push("client port paused (storage)");
  if (status.journal_error) out.push("journal: " + status.journal_error);
  if (status.journal_blocked) out.push("journal blocked");
  if (status.failed) out.push("failed: " + status.failed);
  if (s.status_error) out.push("status: " + s.status_error);
  return out;
}

// -- the NATS cluster as a service on JetStream sees it (bus.nats.seen) -----------------

// A service's streams by name: eMQP keeps several, the Event BUS front-end one.
function streamClusters(js) {
  if (js.stream_clusters) return Object.entries(js.stream_clusters).filter(([k]) => k !== "_omitted");
  return js.stream_cluster ? [[js.stream, js.stream_cluster]] : [];
}

function serverState(s) {
  if (s.lame_duck) return ["lame duck", "warn"];
  return s.connected ? ["connected", ""] : ["unreachable", "warn"];
}

function replicaTrouble(r) {
  if (!r.current || r.offline) return "not current";
  if (r.lag > REPLICA_LAG_WARN) return r.lag + " operations behind";
  return null;
}

function leaderless(cluster) {
  return Boolean(cluster && cluster.known && !cluster.leader);
}

// For the service's card: what is wrong in its cluster, each [text, "alarm" | "caution"].
function clusterProblems(js) {
  const out = [];
  if (!js || !Array.isArray(js.servers)) return out;
  for (const s of js.servers) {
    if (!s.connected) out.push(["NATS server " + s.url + " unreachable", "caution"]);
    else if (s.lame_duck) out.push(["NATS server " + s.url + " in lame-duck mode", "caution"]);
  }
  for (const [name, c] of streamClusters(js)) {
    if (leaderless(c)) {  // what its followers are is no leader's word then
      out.push(["stream " + name + ": no leader" + (c.unread ? " (" + c.unread + ")" : ""), "alarm"]);
      continue;
    }
    for (const r of c.replicas || []) {
      const trouble = replicaTrouble(r);
      if (trouble) out.push(["stream " + name + ": replica " + r.name + " " + trouble, "caution"]);
    }
  }
  for (const c of js.consumers || []) {
    if (leaderless(c.cluster)) out.push(["consumer " + c.name + ": no leader", "alarm"]);
  }
  return out;
}

// What a service says of its NATS cluster, in the shape of a JetStream service's
// (bus.nats.seen): the Event BUS's and eMQP's stores, mc0's and eMQP pub/sub's links to the
// other brokers (no stream: core NATS subjects), the DBP catalog's shared bucket.
function natsOf(name, status) {
  if (status.jetstream) return status.jetstream;
  if (name === "dbp") return status.shared ? {...status.shared, stream: status.shared.bucket} : null;
  return status.cluster && Array.isArray(status.cluster.servers) ? status.cluster : null;
}

// For the card of a service linked to other brokers or instances: its link down, or its
// view of the shared catalog stale, each [text, "alarm"].
function linkProblems(name, status) {
  if (name === "dbp") {
    const shared = status.shared;
    return shared && !shared.current ? [["shared catalog: this instance's view is not current", "alarm"]] : [];
  }
  if (name === "mc0" || name === "emqp-pubsub") {
    const link = status.cluster;
    return link && !link.connected ? [["NATS link down: the other brokers are not reached", "alarm"]] : [];
  }
  return [];
}

function linkFact(link) {
  if (!link) return ["NATS link", "none (one broker)"];
  const server = link.server || ((link.servers || []).find((s) => (s.ours || []).length) || {}).url;
  return ["NATS link", link.connected ? "up" + (server ? " via " + server : "") : "down", link.connected ? "good" : "bad"];
}

// The section's tables, made once per service: the servers for every one; the streams and
// consumers for those that keep some (the Event BUS's and eMQP's stores, DBP's bucket).
function clusterTables(section, service, kinds) {
  const table = (body, ...heads) => el("table", {class: "rows"},
    el("thead", {}, el("tr", {}, ...heads.map((h) => el("th", {}, h)))), el("tbody", {id: service + "-" + body}));
  section.append(el("h3", {}, "NATS cluster"), table("servers", "server", "state", "our connections"));
  if (kinds.streams) section.append(table("streams", "stream", "leader", "replica", "current", "lag", "last heard"));
  if (kinds.consumers) section.append(table("consumers", "consumer", "for", "stream", "leader", "pending", "ack pending"));
}

function clusterView(service, js, kinds = {streams: true, consumers: true}) {
  const section = $(service + "-cluster");
  section.hidden = !(js && Array.isArray(js.servers));
  if (section.hidden) return;
  if (!section.childElementCount) clusterTables(section, service, kinds);
  rows(service + "-servers", js.servers, (s) => {
    const [state, cls] = serverState(s);
    return el("tr", {"data-server": s.url, class: cls}, ...cells(s.url, state, (s.ours || []).join(", ") || "–"));
  }, "no server known");
  if (!kinds.streams) return;
  const streams = [];
  for (const [name, c] of streamClusters(js)) {
    const leader = !c.known ? "not read yet" : c.leader || "none" + (c.unread ? " (" + c.unread + ")" : "");
    const replicas = c.replicas || [];
    if (!replicas.length) {  // one server, or none read: the stream's row alone
      streams.push(el("tr", {"data-stream": name, class: leaderless(c) ? "bad" : ""}, ...cells(name, leader, "–", "–", "–", "–")));
    }
    for (const r of replicas) {
      const cls = leaderless(c) ? "bad" : replicaTrouble(r) ? "warn" : "";
      streams.push(el("tr", {"data-stream": name, "data-replica": r.name, class: cls},
        ...cells(name, leader, r.name + (r.offline ? " (offline)" : ""), r.current ? "yes" : "no", r.lag,
                 duration(r.active_s) + " ago")));
    }
  }
  $(service + "-streams").replaceChildren(...streams);
  if (!kinds.consumers) return;
  rows(service + "-consumers", js.consumers, (c) => {
    const cl = c.cluster;
    const leader = !cl ? "–" : !cl.known ? "not read yet" : cl.leader || "none";
    return el("tr", {"data-consumer": c.name, class: leaderless(cl) ? "bad" : ""},
      ...cells(c.name, c.serves ? c.role + " " + c.serves : c.role, c.stream, leader,
               c.pending ?? "–", c.ack_pending ?? "–"));
  }, "no consumer now");
}

function drops(status) {
  const dropped = status.dropped || {};
  const reasons = Object.entries(dropped).filter(([k, v]) => typeof v === "number" && v > 0);
  if (!reasons.length) return null;
  return "drops: " + reasons.map(([k, v]) => k + " " + v).join(", ");
}

function card(s, now) {
  const status = s.status || {};
  const node = el("article", {class: "card", id: "card-" + s.name, "data-service": s.name},
    el("h2", {}, NAMES[s.name] || s.name,
      el("span", {class: "state " + (s.running ? "up" : "down")}, s.running ? "up" : "down")),
    el("div", {class: "line"}, s.running ? "up " + duration(s.uptime_s)
                                         : "down since " + new Date(s.since * 1000).toLocaleTimeString()));
  for (const label of chartLabels(s.name)) {
    if (label === "dropped") continue;
    const {points, stored} = chartPoints(s.name, label);
    const last = points.length ? points[points.length - 1][1] : undefined;
    node.append(el("div", {class: "line"}, label + " " + rate(last)), spark(points, "", now, stored));
  }
  const dropped = chartPoints(s.name, "dropped");
  if (dropped.points.some((p) => p[1] > 0)) {
    node.append(el("div", {class: "line"}, "drops " + rate(dropped.points[dropped.points.length - 1][1])),
                spark(dropped.points, "drops", now, dropped.stored));
  }
  const dropLine = drops(status);
  if (dropLine) node.append(el("div", {class: "line"}, dropLine));
  for (const problem of problems(s)) node.append(el("div", {class: "line alarm"}, problem));
  for (const [text, cls] of linkProblems(s.name, status)) node.append(el("div", {class: "line " + cls}, text));
  for (const [text, cls] of clusterProblems(natsOf(s.name, status))) node.append(el("div", {class: "line " + cls}, text));
  node.addEventListener("click", () => {
    const view = $(s.name + "-view") || $("other-" + s.name);
    if (view) view.scrollIntoView({behavior: "smooth"});
  });
  return node;
}

function facts(id, pairs) {
  const box = $(id);
  box.replaceChildren(...pairs.filter((p) => p[1] !== undefined && p[1] !== null)
    .map(([k, v, cls]) => el("span", {class: cls || ""}, k + " ", el("b", {}, v))));
}

function rows(id, items, make, empty) {
  const body = $(id);
  const made = (items || []).map(make);
  if (!made.length && empty) made.push(el("tr", {}, el("td", {colspan: 9, class: "dim"}, empty)));
  body.replaceChildren(...made);
}

function cells(...values) {
  return values.map((v) => el("td", {}, v));
}

function omitted(status, key) {
  const n = status[key + "_omitted"];
  return n ? " (and " + n + " more)" : "";
}

const VIEWS = {
  eventbus(status) {
    const clients = status.clients || {};
    const ha = status.ha || null;
    facts("eventbus-facts", [
      ["sequence", status.sequence],
      ["released", status.released !== status.sequence ? status.released : undefined],
      ...Object.entries(clients).map(([k, v]) => ["clients on " + k, typeof v === "object" ? JSON.stringify(v) : v]),
      ["snapshots running", status.snapshots_active],
      ["stalled", status.snapshots_stalled, status.snapshots_stalled ? "warn" : ""],
      ["waiting", status.snapshots_waiting],
      ["pair", ha ? ha.role + ", " + ha.state : "none (one server)"],
      ["peer", ha ? (ha.peer ? ha.peer_address + " (" + ha.peer.state + ", heard " + duration(ha.peer.heard_s_ago) + " ago)"
                             : ha.peer_address + " (not heard)") : undefined, ha && !ha.peer ? "warn" : ""],
      ["behind", ha && ha.behind ? ha.behind : undefined, "warn"],
      ["storage", status.storage_error ? status.storage_error : "ok", status.storage_error ? "bad" : "good"],
      ["security", (status.curve || {}).security],
    ]);
    rows("eventbus-snapshots", status.snapshot_clients,
      (c) => el("tr", {"data-client": c.client, class: c.idle_s > 10 ? "warn" : ""},
        ...cells(c.client, c.streams, c.sent, duration(c.running_s), duration(c.idle_s), c.waiting),
        actionCell(actionButton("eventbus", "drop-snapshot", {client: c.client}, "drop"))),
      "no snapshot running");
    clusterView("eventbus", status.jetstream);
  },
  emqp(status) {
    facts("emqp-facts", [
      ["waiting", status.waiting],
      ["in flight", status.in_flight_count],
      ["workers", (status.workers || []).length + omitted(status, "workers")],
      ["schedules", status.schedules_count],
      ["stored", status.stored],
      ["store", emqpStore(status.jetstream), status.jetstream && !status.jetstream.connected ? "bad" : ""],
      ["storage", status.storage_error ? status.storage_error : "ok", status.storage_error ? "bad" : "good"],
    ]);
    clusterView("emqp", status.jetstream);
    rows("emqp-queues", Object.entries(status.queues || {}).filter(([k]) => k !== "_omitted"),
      ([name, q]) => el("tr", {"data-queue": name, class: q.paused ? "warn" : ""},
        ...cells(name + (q.paused ? " (paused)" : ""), q.depth, q.workers, q.free_slots, q.dispatched, q.rejected),
        actionCell(q.paused ? actionButton("emqp", "resume", {queue: name}, "resume")
                            : actionButton("emqp", "pause", {queue: name}, "pause"),
                   actionButton("emqp", "purge", {queue: name}, "purge"))),
      "no queue yet");
    rows("emqp-workers", status.workers,
      (w) => el("tr", {"data-worker": w.id}, ...cells(w.id, (w.queues || []).map((q) => q[1]).join(", "),
        w.free_slots, w.in_flight, w.dispatched, duration(w.last_seen_s) + " ago", duration(w.expires_in_s)),
        actionCell(actionButton("emqp", "forget-worker", {worker: w.id}, "forget"))),
      "no worker connected");
    rows("emqp-schedules", status.schedules,
      (s) => el("tr", {"data-schedule": s.id}, ...cells(s.id, scheduleJob(s), s.queue, s.cron || ("every " + duration(s.interval)),
        "in " + duration(s.next_run_in), s.runs),
        actionCell(actionButton("emqp", "remove-schedule", {schedule: s.id}, "remove"))),
      "no schedule");
  },
  "emqp-pubsub"(status) {
    const connections = status.connections || {};
    const link = status.cluster || null;
    const refused = Object.entries((link && link.refused) || {}).map(([k, v]) => k + " " + v).join(", ");
    facts("emqp-pubsub-facts", [
      ["publishers", connections.incoming], ["subscribers", connections.outgoing],
      ["published", status.published], linkFact(link),
      ["sent to the others", link ? link.sent : undefined], ["from the others", link ? link.received : undefined],
      ["repeats dropped", link ? link.repeats_dropped : undefined],
      ["not sent", link && refused ? refused : undefined, "warn"],
      ["NATS filters", link ? (link.filters || []).length : undefined],
    ]);
    clusterView("emqp-pubsub", link, {streams: false, consumers: false});
  },
  mc0(status) {
    const auth = status.auth || {};
    const link = status.cluster || null;
    const held = link && link.held ? link.held : undefined;
    facts("mc0-facts", [
      ["clients", status.clients], ["topics", status.topics], ["connections", status.connections],
      ["security", status.security], ["accepted keys", auth.accepted], ["refused", auth.denied, auth.denied ? "warn" : ""],
      linkFact(link),
      ["relayed out", link ? link.published : undefined], ["relayed in", link ? link.received : undefined],
      ["held for the link", held, "warn"],
    ]);
    clusterView("mc0", link, {streams: false, consumers: false});
    rows("mc0-clients", status.client_list,
      (c) => el("tr", {"data-client": c.id}, ...cells(c.id, (c.topics || []).join(", "), duration(c.last_heard_s) + " ago", duration(c.connected_s))),
      "no client");
    rows("mc0-refused", auth.refused_keys,
      (k) => el("tr", {}, ...cells(k.key, k.times, k.reason, k.address)), "none refused");
  },
  dbp(status) {
    const shared = status.shared || null;
    facts("dbp-facts", [
      ["active", status.services], ["inactive", status.services_inactive],
      ["beacon", status.beacon || "off"], ["UDP port", status.udp_port],
      ["shared catalog", shared ? shared.bucket + (shared.current ? ", current" : ", not current") : "none (one catalog)",
       shared ? (shared.current ? "good" : "bad") : ""],
      ["keys", shared ? shared.keys : undefined],
      ["writes refused", shared && shared.writes_refused ? shared.writes_refused : undefined, "warn"],
    ]);
    clusterView("dbp", natsOf("dbp", status), {streams: true, consumers: false});
    rows("dbp-catalog", status.catalog,
      (e) => el("tr", {"data-entry": e.name}, ...cells(e.name, e.active ? "active" : "inactive", e.heartbeat_path,
        e.last_heard_s === null ? "never" : duration(e.last_heard_s) + " ago", duration(e.registered_s) + " ago")),
      "the catalog is empty");
  },
  zre(status) {
    const peers = status.peer_list || [];
    facts("zre-facts", [
      ["name", status.name], ["peers", status.peers], ["pending", status.peers_pending],
      ["evasive", peers.filter((p) => p.state === "evasive").length, "warn"],
      ["silent", peers.filter((p) => p.state === "silent").length, "bad"],
      ["own groups", (status.groups || []).join(", ") || "none"],
      ["groups seen", Object.entries(status.peer_groups || {}).map(([g, n]) => g + " (" + n + ")").join(", ") || "none"],
    ]);
    rows("zre-peers", peers,
      (p) => el("tr", {"data-peer": p.uuid, class: p.state}, ...cells(p.uuid.slice(0, 8), p.name, p.state,
        (p.groups || []).join(", "), p.endpoint, duration(p.last_seen_s) + " ago")),
      "no peer");
  },
  "spark-bridge"(status) {
    facts("spark-bridge-facts", [
      ["journal position", status.sequence], ["bus sequence", status.bus_sequence],
      ["lag", status.journal_lag, status.journal_lag > 1000 ? "warn" : ""],
      ["journaled", status.journaled], ["pending", status.pending],
      ["gaps", status.gaps_recorded, status.gaps_recorded ? "warn" : ""],
    ]);
  },
};

function otherView(s) {
  // A service the console has no view of (a third party's): its numbers, as they come.
  const id = "other-" + s.name;
  let view = $(id);
  if (!view) {
    view = el("section", {class: "view", id}, el("h2", {}, NAMES[s.name] || s.name), el("div", {class: "facts"}));
    $("other-views").append(view);
  }
  const pairs = Object.entries(s.status || {}).filter(([k, v]) => typeof v !== "object" || v === null);
  view.querySelector(".facts").replaceChildren(
    ...pairs.map(([k, v]) => el("span", {}, k.replaceAll("_", " ") + " ", el("b", {}, v))));
}

function render(state) {
  const now = state.t || state.time;
  noteActions(state);
  $("process").textContent =
    "bus " + state.version + ", pid " + state.pid + ", up " + duration(state.uptime_s);
  $("services").replaceChildren(...state.services.map((s) => card(s, now)));
  drawAlerts(state);  // alerts.js: the list, and the cards framed by their alerts
  for (const s of state.services) {
    if (s.name === "http") continue;
    const view = $(s.name + "-view");
    if (view) {
      view.hidden = false;
      if (s.running) VIEWS[s.name](s.status || {});
    } else if (!KNOWN_VIEWS.has(s.name)) {
      otherView(s);
    }
  }
}

// -- the topic tail ---------------------------------------------------------------------

function startTail(event) {
  event.preventDefault();
  stopTail();
  const topic = $("tail-topic").value || "/";
  const controller = new AbortController();
  tailStream = controller;
  $("tail-rows").replaceChildren();
  $("tail-start").disabled = true;
  $("tail-stop").disabled = false;
  $("tail-state").textContent = "connecting";
  stream("/api/v1/tail?topic=" + encodeURIComponent(topic), onTailEvent, controller)
    .then(() => endTail("the server ended the tail"))
    .catch((error) => {
      if (!controller.signal.aborted) endTail(error && error.detail ? error.detail : "the tail was cut");
    });
}

// The topic browser: the subtrees the tail has shown, busiest first; one click narrows the
// tail to that subtree (or widens it to a parent).
const topicsSeen = new Map();

function noteTopic(topic) {
  const parts = topic.split("/").filter(Boolean);
  for (let depth = 1; depth <= parts.length; depth++) {
    const subtree = "/" + parts.slice(0, depth).join("/") + "/";
    topicsSeen.set(subtree, (topicsSeen.get(subtree) || 0) + 1);
  }
  if (topicsSeen.size > 500) {  // bounded: the least seen go
    const kept = [...topicsSeen].sort((a, b) => b[1] - a[1]).slice(0, 250);
    topicsSeen.clear();
    for (const [k, v] of kept) topicsSeen.set(k, v);
  }
}

function drawTopics() {
  const busiest = [...topicsSeen].sort((a, b) => b[1] - a[1]).slice(0, 20);
  $("tail-topics").replaceChildren(...busiest.map(([subtree, count]) => {
    const chip = el("button", {type: "button", "data-subtree": subtree, title: count + " events shown"}, subtree);
    chip.addEventListener("click", () => {
      $("tail-topic").value = subtree;
      $("tail-form").requestSubmit();
    });
    return chip;
  }));
}
setInterval(() => { if (tailStream) drawTopics(); }, 1000);

function onTailEvent(name, data) {
  const body = $("tail-rows");
  if (name === "tail") {
    $("tail-state").textContent = "tailing " + data.topic;
    return;
  }
  let row;
  if (name === "event") {
    noteTopic(data.topic);
    row = el("tr", {"data-seq": data.sequence}, ...cells(data.sequence, data.topic, data.producer, data.timestamp));
    row.append(el("td", {class: "value"}, data.value));
  } else if (name === "skipped") {
    const why = data.sampled ? "at most 20 a second; the subtree goes faster than the console samples, so more went by"
                             : "at most 20 a second";
    row = el("tr", {class: "skipped"}, el("td", {colspan: 5}, data.events + " more events not shown (" + why + ")"));
  } else {
    return;
  }
  body.prepend(row);
  while (body.childElementCount > TAIL_ROWS) body.lastElementChild.remove();
}

function stopTail() {
  if (tailStream) tailStream.abort();
  tailStream = null;
  $("tail-start").disabled = false;
  $("tail-stop").disabled = true;
  $("tail-state").textContent = "";
}

function endTail(why) {
  stopTail();
  $("tail-state").textContent = why;
}

// -- start ------------------------------------------------------------------------------

$("token-form").addEventListener("submit", (event) => {
  event.preventDefault();
  sessionStorage.setItem(TOKEN_KEY, $("token").value.trim());
  if (stateStream) stateStream.abort();
  loadPast();
  connect();
});
$("tail-form").addEventListener("submit", startTail);
$("span").addEventListener("change", loadPast);
$("tail-stop").addEventListener("click", stopTail);
loadPast();
connect();
