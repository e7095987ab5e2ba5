// The status page: polls the node's own HTTP API and redraws. No build step, no dependencies.
"use strict";
const PERIOD = Number(new URLSearchParams(location.search).get("refresh")) || 2;  // seconds
const HISTORY = Math.ceil(300 / PERIOD);  // samples kept for the graph: the last 5 minutes
const MAX_QUEUES = 100;
const last = {};  // queue -> {t, produced, consumed}: the previous sample, for rates
const history = [];  // [{t, produced, consumed}] totals of messages/s

function token() { return localStorage.getItem("queue-token") || ""; }

async function api(path) {
  const headers = token() ? {Authorization: "Bearer " + token()} : {};
  const response = await fetch(path, {headers});
  const body = await response.json();
  if (response.status === 401 || response.status === 403) {
    document.getElementById("auth").hidden = false;
  }
  if (!response.ok) throw new Error(path + ": " + response.status + " " + (body.reason || ""));
  return body;
}

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text === null || text === undefined ? "-" : String(text);
  if (cls) td.className = cls;
  return td;
}

function drawNodes(cluster) {
  document.getElementById("served-by").textContent = "node " + cluster.node_id;
  const body = document.querySelector("#nodes tbody");
  body.replaceChildren();
  for (const n of cluster.nodes) {
    const row = body.insertRow();
    row.dataset.nodeId = n.node_id;
    if (n.node_id === cluster.node_id) row.className = "self";
    cell(row, n.node_id, "node-id");
    cell(row, n.role, "role role-" + n.role);
    cell(row, n.vote_id, "vote-id");
    cell(row, n.trans_id, "trans-id");
    cell(row, n.commit_trans_id, "commit");
    cell(row, n.lag, "lag");
    cell(row, mib(n.memory_bytes), "memory");  // known of the answering node only
    cell(row, mib(n.overflow_bytes), "on-disk");
  }
}

function mib(bytes) {
  return bytes === undefined || bytes === null ? null : (bytes / 1048576).toFixed(1) + " MiB";
}

function drawGroups(cluster) {
  // With queue groups only: each group's leader and log, as the answering node sees it.
  const groups = cluster.groups || [];
  document.getElementById("groups-section").hidden = groups.length === 0;
  const body = document.querySelector("#groups tbody");
  body.replaceChildren();
  for (const g of groups) {
    const row = body.insertRow();
    row.dataset.group = g.group;
    cell(row, g.group, "group");
    cell(row, g.leader_node_id || null, "leader");
    cell(row, g.role, "role role-" + g.role);
    cell(row, g.trans_id, "trans-id");
    cell(row, g.commit_trans_id, "commit");
    cell(row, (g.replicas || []).join(", "), "replicas");
  }
}

function rate(now, before, key) {
  if (!before || now.t <= before.t) return 0;
  return Math.max(0, (now[key] - before[key]) / (now.t - before.t));
}

function drawQueues(rows, t) {
  const body = document.querySelector("#queues tbody");
  body.replaceChildren();
  let produced = 0, consumed = 0;
  for (const [name, m] of rows) {
    const now = {t, produced: m.produced || 0, consumed: m.consumed || 0};
    const p = rate(now, last[name], "produced"), c = rate(now, last[name], "consumed");
    last[name] = now;
    produced += p;
    consumed += c;
    const row = body.insertRow();
    row.dataset.queue = name;
    cell(row, name, "name");
    cell(row, m.ready, "ready");
    cell(row, m.delayed, "delayed");
    cell(row, m.in_flight, "leased");
    cell(row, m.dead, "dead");
    cell(row, m.overflowed || 0, "overflowed");
    cell(row, p.toFixed(1), "produced-rate");
    cell(row, c.toFixed(1), "consumed-rate");
  }
  document.getElementById("no-queues").hidden = rows.length > 0;
  history.push({t, produced, consumed});
  if (history.length > HISTORY) history.shift();
}

function drawGraph() {
  // x: time, the right edge now and the left edge HISTORY refreshes ago; y: messages/s
  const top = Math.max(1, ...history.map(h => Math.max(h.produced, h.consumed)));
  const now = history.length ? history[history.length - 1].t : 0, span = HISTORY * PERIOD;
  const points = key => history.map(h =>
    (600 - (now - h.t) * 600 / span).toFixed(1) + "," + (158 - h[key] * 140 / top).toFixed(1)).join(" ");
  document.getElementById("produced-line").setAttribute("points", points("produced"));
  document.getElementById("consumed-line").setAttribute("points", points("consumed"));
  document.getElementById("graph-max").textContent = top.toFixed(0) + "/s";
}

async function refresh() {
  const error = document.getElementById("error");
  try {
    const t = Date.now() / 1000;
    const cluster = await api("/v1/cluster");
    drawNodes(cluster);
    drawGroups(cluster);
    const list = await api("/v1/queues");
    const names = list.queue_list.slice().sort();
    const dead = new Set(names.filter(n => n.endsWith(".dlq") && names.includes(n.slice(0, -4))));
    const shown = names.filter(n => !dead.has(n)).slice(0, MAX_QUEUES);
    const stats = await Promise.all(shown.map(n => api("/v1/queues/" + encodeURIComponent(n))));
    drawQueues(shown.map((n, i) => [n, stats[i]]), t);
    drawGraph();
    document.getElementById("updated").textContent = "updated " + new Date().toLocaleTimeString();
    error.hidden = true;
  } catch (e) {
    error.textContent = String(e.message || e);
    error.hidden = false;
  }
}

document.getElementById("auth").addEventListener("submit", event => {
  event.preventDefault();
  localStorage.setItem("queue-token", document.getElementById("token").value);
  document.getElementById("auth").hidden = true;
  refresh();
});
document.getElementById("period").textContent = PERIOD;
refresh();
setInterval(refresh, PERIOD * 1000);
