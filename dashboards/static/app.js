// Herald dashboard: fetches /api/panels and draws every panel as inline SVG / tables.
// No libraries, nothing loaded from outside. Each panel gets data-state (ok | empty | error)
// and data-rows, which the Chromium test reads.
"use strict";

const NS = "http://www.w3.org/2000/svg";
const COLORS = {
  accepted: "#7f8fa6", planned: "#5b7bd5", suppressed: "#b38bd9", provider_accepted: "#3867d6",
  delivered: "#20a36b", opened: "#2bb3a3", read: "#23a08f", clicked: "#158f86", failed: "#d64545",
  unknown: "#9aa3b5", expired: "#e0a020",
  transactional: "#d64545", normal: "#3867d6", bulk: "#9aa3b5",
  applied: "#20a36b", duplicate: "#9aa3b5", stale: "#c4cad6", premature: "#e0a020",
  unmappable: "#b38bd9", unmatched: "#d64545",
  p50: "#9db5f0", p95: "#5b7bd5", p99: "#1f3f99",
};
const STATE_COLORS = {
  DELIVERED: "#20a36b", READ: "#158f86", OPENED: "#2bb3a3", CLICKED: "#0e7a72",
  PROVIDER_ACCEPTED: "#3867d6", DELIVERY_UNKNOWN: "#9aa3b5", UNKNOWN: "#b6bdcc",
  FAILED_PERMANENT: "#d64545", EXPIRED: "#e0a020", SUPPRESSED: "#b38bd9", PLANNED: "#7f8fa6",
  QUEUED: "#8fa0bd", SENDING: "#6f86b5", RETRY_SCHEDULED: "#e8b95a", SCHEDULED: "#a3b1c9",
};
const palette = ["#3867d6", "#20a36b", "#e0a020", "#d64545", "#b38bd9", "#2bb3a3", "#7f8fa6"];

let minutes = 60;
let timer = null;

function el(tag, attrs = {}, children = []) {
  const node = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") node.textContent = v; else node.setAttribute(k, v);
  }
  for (const child of [].concat(children)) if (child) node.append(child);
  return node;
}

function svg(tag, attrs = {}, children = []) {
  const node = document.createElementNS(NS, tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (k === "text") node.textContent = v; else node.setAttribute(k, v);
  }
  for (const child of [].concat(children)) if (child) node.append(child);
  return node;
}

const fmt = (n) => (n == null ? "–" : Number(n).toLocaleString("en-US", { maximumFractionDigits: 1 }));
const pct = (r) => (r == null ? null : `${(r * 100).toFixed(1)}%`);
const ms = (v) => (v == null ? "–" : v >= 1000 ? `${(v / 1000).toFixed(2)} s` : `${Math.round(v)} ms`);

function swatch(color, label) {
  const i = el("i");
  i.style.background = color;
  return el("span", {}, [i, label]);
}

function empty(text = "no data in this window") {
  return el("div", { class: "empty", text });
}

// -- charts ----------------------------------------------------------------------------------

function hbars(items, { width = 560, label = 150, color = () => "#3867d6", note = () => "" } = {}) {
  const row = 26;
  const max = Math.max(1, ...items.map((d) => d.value));
  const chart = svg("svg", { viewBox: `0 0 ${width} ${items.length * row + 4}`, width: "100%", role: "img" });
  items.forEach((d, i) => {
    const y = i * row + 2;
    const w = Math.max(d.value > 0 ? 2 : 0, ((width - label - 120) * d.value) / max);
    chart.append(
      svg("text", { x: label - 8, y: y + 16, "text-anchor": "end", text: d.label }),
      svg("rect", { x: label, y: y + 3, width: w, height: row - 8, rx: 3, fill: color(d), class: "bar" }, [
        svg("title", { text: `${d.label}: ${fmt(d.value)}` }),
      ]),
      svg("text", { x: label + w + 6, y: y + 16, text: `${fmt(d.value)} ${note(d)}`.trim() }),
    );
  });
  return chart;
}

function miniBar(ratio, color) {
  const s = svg("svg", { viewBox: "0 0 90 10", width: 90, height: 10 });
  s.append(svg("rect", { x: 0, y: 1, width: 90, height: 8, rx: 4, fill: "#eef1f6" }));
  if (ratio != null) s.append(svg("rect", { x: 0, y: 1, width: Math.max(2, 90 * Math.min(1, ratio)), height: 8, rx: 4, fill: color, class: "bar" }));
  return s;
}

function niceStep(raw) {
  const mag = 10 ** Math.floor(Math.log10(Math.max(raw, 1)));
  const n = raw / mag;
  return (n <= 1 ? 1 : n <= 2 ? 2 : n <= 5 ? 5 : 10) * mag;
}

function lines(rows, series, { width = 1100, height = 220 } = {}) {
  const pad = { l: 48, r: 16, t: 10, b: 26 };
  const xs = rows.map((r) => Date.parse(r.t));
  const x0 = Math.min(...xs), x1 = Math.max(...xs, x0 + 60000);
  const top = Math.max(1, ...rows.flatMap((r) => series.map((s) => r[s] || 0)));
  const step = niceStep(top / 4);
  const ymax = Math.ceil(top / step) * step;
  const X = (t) => pad.l + ((t - x0) / (x1 - x0 || 1)) * (width - pad.l - pad.r);
  const Y = (v) => height - pad.b - (v / ymax) * (height - pad.t - pad.b);
  const chart = svg("svg", { viewBox: `0 0 ${width} ${height}`, width: "100%", role: "img" });
  for (let v = 0; v <= ymax + 1e-9; v += step) {
    chart.append(svg("line", { x1: pad.l, x2: width - pad.r, y1: Y(v), y2: Y(v), class: "axis" }),
      svg("text", { x: pad.l - 6, y: Y(v) + 4, "text-anchor": "end", text: fmt(Math.round(v)) }));
  }
  [x0, (x0 + x1) / 2, x1].forEach((t, i) => chart.append(svg("text", {
    x: X(t), y: height - 6, "text-anchor": ["start", "middle", "end"][i],
    text: new Date(t).toISOString().slice(11, 16) + " UTC",
  })));
  for (const s of series) {
    const pts = rows.map((r) => `${X(Date.parse(r.t)).toFixed(1)},${Y(r[s] || 0).toFixed(1)}`);
    chart.append(svg("polyline", { points: pts.join(" "), fill: "none", stroke: COLORS[s], "stroke-width": 2, class: "series" }));
    rows.forEach((r) => chart.append(svg("circle", { cx: X(Date.parse(r.t)), cy: Y(r[s] || 0), r: 2.5, fill: COLORS[s] }, [
      svg("title", { text: `${s} ${r.t}: ${fmt(r[s])}` }),
    ])));
  }
  return el("div", {}, [chart, el("div", { class: "legend" }, series.map((s) => swatch(COLORS[s], s.replace("_", " "))))]);
}

function stacked(groups, { width = 420, label = 90 } = {}) {
  // groups: [{label, parts: [{name, value, color}]}]
  const row = 24;
  const chart = svg("svg", { viewBox: `0 0 ${width} ${groups.length * row + 4}`, width: "100%", role: "img" });
  groups.forEach((g, i) => {
    const total = g.parts.reduce((a, p) => a + p.value, 0) || 1;
    let x = label;
    chart.append(svg("text", { x: label - 8, y: i * row + 16, "text-anchor": "end", text: g.label }));
    for (const p of g.parts) {
      const w = ((width - label - 10) * p.value) / total;
      chart.append(svg("rect", { x, y: i * row + 4, width: Math.max(0, w - 1), height: row - 8, fill: p.color, class: "bar" }, [
        svg("title", { text: `${g.label} · ${p.name}: ${fmt(p.value)}` }),
      ]));
      x += w;
    }
  });
  const names = [...new Map(groups.flatMap((g) => g.parts).map((p) => [p.name, p.color])).entries()];
  return el("div", {}, [chart, el("div", { class: "legend" }, names.map(([n, c]) => swatch(c, n.toLowerCase())))]);
}

// -- panels ----------------------------------------------------------------------------------

const RENDER = {
  funnel(rows) {
    const by = Object.fromEntries(rows.map((r) => [r.step, r.count]));
    const planned = by.planned || 0;
    const items = rows.map((r) => ({ label: r.step.replace("_", " "), key: r.step, value: r.count }));
    if (!items.some((d) => d.value > 0)) return null;
    return hbars(items, {
      width: 1100, color: (d) => COLORS[d.key],
      note: (d) => (planned && !["accepted", "planned"].includes(d.key) ? `· ${pct(d.value / planned)} of planned` : ""),
    });
  },

  report_rates(rows) {
    if (!rows.length) return null;
    const head = ["channel", "deliveries", "acceptance", "provider accept", "observable delivery", "open", "unknown outcome"];
    const rate = (value, shown, color) => {
      if (shown === "unknown") return el("span", { class: "badge unknown", text: "unknown", title: "not provided by this channel" });
      return el("div", { class: "rate" }, [miniBar(value, color), el("span", { text: shown || pct(value) || "–" })]);
    };
    const body = rows.map((r) => el("tr", {}, [
      el("td", {}, el("b", { text: r.channel })),
      el("td", { class: "num", text: fmt(r.deliveries) }),
      el("td", {}, rate(r.acceptance_rate, null, COLORS.planned)),
      el("td", {}, rate(r.provider_accept_rate, null, COLORS.provider_accepted)),
      el("td", {}, rate(r.observable_delivery_rate, r.observable_delivery_rate_shown, COLORS.delivered)),
      el("td", {}, rate(r.open_rate, r.open_rate_shown, COLORS.opened)),
      el("td", { class: "num", text: fmt(r.delivery_unknown) }),
    ]));
    return el("table", {}, [el("thead", {}, el("tr", {}, head.map((h) => el("th", { text: h })))), el("tbody", {}, body)]);
  },

  rates_over_time(rows) {
    if (!rows.length) return null;
    return lines(rows, ["provider_accepted", "delivered", "failed", "unknown"]);
  },

  latency_by_class(rows) {
    if (!rows.length) return null;
    const out = el("div");
    for (const stage of ["accept_to_provider", "provider_to_delivered"]) {
      const mine = rows.filter((r) => r.stage === stage);
      if (!mine.length) continue;
      const max = Math.max(1, ...mine.map((r) => r.p99_ms));
      const width = 420, label = 100, row = 18;
      const chart = svg("svg", { viewBox: `0 0 ${width} ${mine.length * row * 3 + 6}`, width: "100%", role: "img" });
      mine.forEach((r, i) => {
        const y0 = i * row * 3;
        chart.append(svg("text", { x: label - 8, y: y0 + row * 1.5 + 4, "text-anchor": "end", text: r.traffic_class }));
        ["p50", "p95", "p99"].forEach((q, k) => {
          const v = r[`${q}_ms`];
          const w = Math.max(2, ((width - label - 80) * v) / max);
          chart.append(svg("rect", { x: label, y: y0 + k * row + 2, width: w, height: row - 5, rx: 2, fill: COLORS[q], class: "bar" }, [
            svg("title", { text: `${r.traffic_class} ${q}: ${ms(v)} (${r.samples} samples)` }),
          ]), svg("text", { x: label + w + 5, y: y0 + k * row + 13, text: `${q} ${ms(v)}` }));
        });
      });
      out.append(el("div", { class: "muted", text: stage.replaceAll("_", " ").replace("to", "→") }), chart);
    }
    return out;
  },

  providers(rows, data) {
    const breakers = Object.fromEntries(((data.breakers || {}).rows || []).map((b) => [b.provider, b]));
    const names = [...new Set([...rows.map((r) => r.provider), ...Object.keys(breakers)])].sort();
    if (!names.length) return null;
    const by = Object.fromEntries(rows.map((r) => [r.provider, r]));
    const body = names.map((p) => {
      const r = by[p] || {};
      const b = breakers[p] || { state: "closed" };
      return el("tr", {}, [
        el("td", {}, el("b", { text: p })),
        el("td", {}, el("span", { class: `badge ${b.state}`, text: b.state.replace("_", "-"), title: b.reason || "" })),
        el("td", { title: `retried ${fmt(r.retried)}, unknown ${fmt(r.unknown)}` }, el("div", { class: "rate small" }, [
          miniBar(r.error_rate, COLORS.failed), el("span", { text: pct(r.error_rate) || "–" }),
        ])),
        el("td", { class: "num", text: fmt(r.accepted) }),
        el("td", { class: "num", text: fmt(r.failed) }),
      ]);
    });
    const head = ["provider", "breaker", "error rate", "accepted", "failed"];
    return el("table", {}, [el("thead", {}, el("tr", {}, head.map((h) => el("th", { text: h })))), el("tbody", {}, body)]);
  },

  lag(rows) {
    if (!rows.length) return null;
    const jobs = {};
    for (const r of rows) jobs[r.job] = (jobs[r.job] || 0) + r.lag;
    const items = Object.entries(jobs).map(([job, value]) => ({ label: job, value }));
    return hbars(items, { width: 420, label: 100, color: (d) => (d.value > 10000 ? COLORS.failed : d.value > 1000 ? COLORS.expired : COLORS.delivered) });
  },

  suppression_reasons(rows) {
    if (!rows.length) return null;
    return hbars(rows.map((r) => ({ label: r.reason, value: r.suppressed })), { width: 420, label: 140, color: () => COLORS.suppressed });
  },

  receipt_outcomes(rows) {
    if (!rows.length) return null;
    const groups = {};
    for (const r of rows) (groups[r.provider] = groups[r.provider] || []).push({ name: r.outcome, value: r.receipts, color: COLORS[r.outcome] || "#7f8fa6" });
    return stacked(Object.entries(groups).map(([label, parts]) => ({ label, parts })));
  },

  current_states(rows) {
    if (!rows.length) return null;
    const groups = {};
    for (const r of rows) (groups[r.channel] = groups[r.channel] || []).push({ name: r.state, value: r.deliveries, color: STATE_COLORS[r.state] || palette[0] });
    return stacked(Object.entries(groups).map(([label, parts]) => ({ label, parts })));
  },
};

function source(data, name) {
  if (name === "providers") return data.provider_errors || { rows: [] };
  return data[name] || { error: "missing from the server's answer" };
}

function draw(data) {
  for (const card of document.querySelectorAll("[data-panel]")) {
    const name = card.dataset.panel;
    const body = card.querySelector(".body");
    const src = source(data, name);
    let node = null;
    if (src.error) {
      card.dataset.state = "error";
      node = el("div", { text: src.error });
    } else {
      try {
        node = RENDER[name](src.rows, data);
        card.dataset.state = node ? "ok" : "empty";
      } catch (err) {
        card.dataset.state = "error";
        node = el("div", { text: `render failed: ${err}` });
      }
    }
    card.dataset.rows = String((src.rows || []).length);
    body.replaceChildren(node || empty());
  }
  document.getElementById("updated").textContent = `updated ${new Date().toISOString().slice(11, 19)} UTC`;
  document.body.dataset.rendered = String(Number(document.body.dataset.rendered || 0) + 1);
}

async function refresh() {
  const tenant = document.getElementById("tenant").value.trim();
  const query = new URLSearchParams({ minutes: String(minutes), tenant });
  try {
    const resp = await fetch(`/api/panels?${query}`, { cache: "no-store" });
    if (!resp.ok) throw new Error(`HTTP ${resp.status}`);
    draw(await resp.json());
  } catch (err) {
    document.getElementById("updated").textContent = `refresh failed: ${err.message}`;
  }
}

function schedule() {
  clearInterval(timer);
  timer = setInterval(refresh, 10000);
}

function init() {
  const params = new URLSearchParams(location.search);
  minutes = Number(params.get("minutes") || 60);
  document.getElementById("tenant").value = params.get("tenant") || "";
  for (const button of document.querySelectorAll("#windows button")) {
    button.classList.toggle("active", Number(button.dataset.minutes) === minutes);
    button.addEventListener("click", () => {
      minutes = Number(button.dataset.minutes);
      document.querySelectorAll("#windows button").forEach((b) => b.classList.toggle("active", b === button));
      refresh();
    });
  }
  document.getElementById("tenant").addEventListener("change", refresh);
  refresh();
  schedule();
}

init();
