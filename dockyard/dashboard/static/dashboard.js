// dockyard dashboard: polls the JSON API and draws the charts as SVG by hand (no library, no
// CDN: the page works with no network but the dashboard's own).
"use strict";

const SVG = "http://www.w3.org/2000/svg";
const W = 300, H = 160, PAD = 28;
// A y label ends LABEL_GAP before the plot and starts at least LABEL_EDGE after the chart's edge.
const LABEL_GAP = 2, LABEL_EDGE = 1;
const POLL_MS = 2000;
// null: the newest page of dead letters; ?dead_before=SEQ opens an older page (a link to it).
const pageQuery = new URLSearchParams(location.search);
let deadBefore = pageQuery.get("dead_before");
const deadSize = pageQuery.get("dead_size");  // null: the server's default page size
let deadOlder = null;

function el(name, attrs, parent) {
  const node = document.createElementNS(SVG, name);
  for (const [key, value] of Object.entries(attrs)) node.setAttribute(key, value);
  if (parent) parent.appendChild(node);
  return node;
}

function frame(container) {
  container.textContent = "";
  return el("svg", { viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: "none" }, container);
}

function empty(svg, text) {
  const label = el("text", { x: W / 2, y: H / 2, "text-anchor": "middle", class: "empty" }, svg);
  label.textContent = text;
}

// The y-axis labels ([y, text] pairs), right-aligned against the plot; returns the plot's left
// edge. The margin is the widest label as the browser measures it, in the chart's units (a
// fixed margin cut "-0.0183" to "0183"), never less than PAD; data-width keeps each measure.
function yLabels(svg, labels) {
  const nodes = labels.map(([y, text]) => {
    const node = el("text", { y, class: "axis", "text-anchor": "end" }, svg);
    node.textContent = text;
    node.setAttribute("data-width", node.getComputedTextLength());
    return node;
  });
  const widest = Math.max(0, ...nodes.map((node) => Number(node.getAttribute("data-width"))));
  const left = Math.max(PAD, Math.ceil(widest) + LABEL_EDGE + LABEL_GAP);
  for (const node of nodes) node.setAttribute("x", left - LABEL_GAP);
  return left;
}

function xLabels(svg, left, first, last) {
  el("text", { x: left, y: H - 8, class: "axis", "text-anchor": "start" }, svg).textContent = `step ${first}`;
  el("text", { x: W - 4, y: H - 8, class: "axis", "text-anchor": "end" }, svg).textContent = `step ${last}`;
}

function valueLabel(v) {
  return Math.abs(v) >= 1000 ? v.toFixed(0) : Number(v.toPrecision(3)).toString();
}

// One series of [step, value] points: a line with a dot per point.
function lineChart(container, points) {
  const svg = frame(container);
  svg.dataset.points = String(points.length);
  if (points.length === 0) return empty(svg, "no data yet");
  const xs = points.map((p) => p[0]), ys = points.map((p) => p[1]);
  const x0 = Math.min(...xs), x1 = Math.max(...xs);
  let y0 = Math.min(...ys), y1 = Math.max(...ys);
  if (y0 === y1) { y0 -= 0.5; y1 += 0.5; }
  const left = yLabels(svg, [[PAD, valueLabel(y1)], [H - PAD, valueLabel(y0)]]);
  const plotW = W - left - PAD;
  const sx = (x) => left + (x1 === x0 ? plotW / 2 : ((x - x0) / (x1 - x0)) * plotW);
  const sy = (y) => H - PAD - ((y - y0) / (y1 - y0)) * (H - 2 * PAD);
  el("path", { class: "line", d: points.map((p, i) => `${i ? "L" : "M"}${sx(p[0])},${sy(p[1])}`).join(" ") }, svg);
  for (const [x, y] of points) {
    el("circle", { class: "point", cx: sx(x), cy: sy(y), r: 2, "data-step": x, "data-value": y }, svg);
  }
  xLabels(svg, left, x0, x1);
}

// The staleness histogram: a bar per age.
function barChart(container, bins) {
  const svg = frame(container);
  svg.dataset.points = String(bins.length);
  if (bins.length === 0) return empty(svg, "no data yet");
  const top = Math.max(...bins.map((b) => b.samples)) || 1;
  const left = yLabels(svg, [[PAD, String(top)]]);
  const width = (W - left - PAD) / bins.length;
  bins.forEach((bin, i) => {
    const h = (bin.samples / top) * (H - 2 * PAD);
    el("rect", { class: "bar", x: left + i * width + 2, y: H - PAD - h, width: Math.max(width - 4, 1),
                 height: h, "data-age": bin.age, "data-samples": bin.samples }, svg);
    el("text", { x: left + i * width + width / 2, y: H - 8, class: "axis", "text-anchor": "middle" }, svg)
      .textContent = `age ${bin.age}`;
  });
}

function cell(row, text, cls) {
  const td = row.insertCell();
  td.textContent = text === null || text === undefined ? "-" : String(text);
  if (cls) td.className = cls;
  return td;
}

function fillRows(tableId, rows, render) {
  const body = document.querySelector(`#${tableId} tbody`);
  body.textContent = "";
  for (const item of rows) render(body.insertRow(), item);
}

function number(value, digits) {
  return value === null || value === undefined ? "-" : Number(value).toFixed(digits);
}

async function getJson(path) {
  const reply = await fetch(path, { cache: "no-store" });
  if (!reply.ok) throw new Error(`${path}: HTTP ${reply.status}`);
  return reply.json();
}

async function refreshMetrics() {
  const data = await getJson("/api/metrics");
  for (const container of document.querySelectorAll(".chart[data-series]")) {
    lineChart(container, data.series[container.dataset.series] || []);
  }
  barChart(document.getElementById("chart-staleness"), data.staleness_histogram);
  document.getElementById("problems").textContent = data.problems.join("; ");
}

async function refreshFleet() {
  const view = await getJson("/api/fleet");
  const notes = view.notes && view.notes.length ? ` (${view.notes.join("; ")})` : "";
  document.getElementById("source").textContent = `from ${view.source}${notes}`;
  document.getElementById("updated").textContent =
    `updated ${new Date(view.taken_at_unix_s * 1000).toLocaleTimeString()}`;
  fillRows("roles", view.roles, (row, r) => {
    if (r.error) { cell(row, "?"); cell(row, r.subject); cell(row, `bad record: ${r.error}`, "silent"); return; }
    cell(row, r.role); cell(row, r.instance);
    cell(row, r.silent ? `silent (${r.state})` : r.state, r.silent ? "silent" : "");
    cell(row, `${number(r.age_s, 0)} s ago`); cell(row, r.weight_version);
    cell(row, r.received); cell(row, number(r.received_per_s, 2)); cell(row, r.published);
    cell(row, r.refused === undefined ? "-" : `${r.refused} / ${r.failures}`); cell(row, r.detail);
  });
  const streamRows = [];
  for (const s of view.streams) {
    // A stream's row, then one row per consumer of it (indented under it).
    streamRows.push([s.name, "", s.messages, s.bytes, "", "", ""]);
    for (const c of s.consumers) {
      streamRows.push(["", c.durable, "", "", c.pending, c.ack_pending, c.redelivered]);
    }
  }
  fillRows("streams", streamRows, (row, values) => values.forEach((v) => cell(row, v)));
  const dead = view.dead_letters;
  document.getElementById("dead-summary").textContent = dead
    ? `${dead.stored} stored, the newest ${dead.counted} counted`
    : "no data plane: dead letters are in the broker";
  fillRows("dead-counts", dead ? dead.by_stage_and_reason : [], (row, c) => {
    cell(row, c.stage); cell(row, c.reason); cell(row, c.count);
  });
}

async function refreshDeadLetters() {
  const query = new URLSearchParams();
  if (deadBefore !== null) query.set("before", deadBefore);
  if (deadSize !== null) query.set("size", deadSize);
  const page = await getJson(`/api/dead-letters?${query}`);
  deadOlder = page.older_before;
  document.getElementById("dead-older").disabled = deadOlder === null;
  document.getElementById("dead-page").textContent = page.items.length
    ? `seq ${page.items[page.items.length - 1].seq}–${page.items[0].seq} of ${page.stored}` : "none";
  fillRows("dead-letters", page.items, (row, d) => {
    cell(row, d.seq); cell(row, d.time);
    if (d.error) { cell(row, "?"); cell(row, "undecodable"); cell(row, d.error); return; }
    cell(row, d.stage); cell(row, d.reason); cell(row, d.detail);
    cell(row, `${d.original_subject} #${d.original_seq ?? "-"} (${d.original_schema || "?"})`);
    cell(row, d.group_id || "-"); cell(row, d.delivery_count);
  });
}

async function refresh() {
  const failures = [];
  for (const step of [refreshMetrics, refreshFleet, refreshDeadLetters]) {
    try { await step(); } catch (error) { failures.push(String(error)); }
  }
  if (failures.length) document.getElementById("problems").textContent = failures.join("; ");
  document.body.dataset.refreshed = String(Number(document.body.dataset.refreshed || 0) + 1);
}

document.getElementById("dead-older").addEventListener("click", () => { deadBefore = deadOlder; refreshDeadLetters(); });
document.getElementById("dead-newest").addEventListener("click", () => { deadBefore = null; refreshDeadLetters(); });
refresh();
setInterval(refresh, POLL_MS);
