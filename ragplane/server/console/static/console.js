// The console's own script: confirmations before actions, and the flip page's charts
// (Chart.js, vendored). No data is fetched here: each page carries its own.
"use strict";

document.addEventListener("submit", (event) => {
  const form = event.target;
  if (form.dataset && form.dataset.confirm && !window.confirm(form.dataset.confirm)) {
    event.preventDefault();
  }
});

const COLORS = ["#2563eb", "#dc2626", "#16a34a", "#9333ea", "#ea580c", "#0891b2", "#4b5563"];

function line(label, xs, ys, color, dashed) {
  return {
    label, data: xs.map((x, i) => ({ x, y: ys[i] })), borderColor: color,
    backgroundColor: color, borderWidth: dashed ? 1.5 : 2, spanGaps: true,
    pointRadius: xs.length < 30 && !dashed ? 2.5 : 0,  // a first sample shows as a dot
    borderDash: dashed ? [6, 4] : [],
  };
}

function clock(t) {
  return new Date(t * 1000).toISOString().slice(11, 19);
}

function draw(container, title, datasets, xTitle, xTime, xLog, yMax) {
  const box = document.createElement("figure");
  box.className = "chart";
  const caption = document.createElement("figcaption");
  caption.textContent = title;
  const plot = document.createElement("div");
  plot.className = "plot";
  const canvas = document.createElement("canvas");
  plot.append(canvas);
  box.append(caption, plot);
  container.append(box);
  new window.Chart(canvas, {
    type: "line",
    data: { datasets },
    options: {
      animation: false, responsive: true, maintainAspectRatio: false, parsing: true,
      interaction: { mode: "nearest", intersect: false },
      scales: {
        x: { type: xLog ? "logarithmic" : "linear", title: { display: true, text: xTitle },
             ticks: xTime ? { callback: (v) => clock(v), maxTicksLimit: 6 } : {} },
        y: yMax ? { type: "linear", min: 0, max: yMax } : { type: "linear" },
      },
      plugins: { legend: { labels: { boxWidth: 12 } } },
    },
  });
}

function ratioCharts(container, ratio, limit, phase) {
  for (const [cls, s] of Object.entries(ratio)) {
    const lim = s.n.map(() => limit);
    // the bound is wide while few batches are timed: it leaves the top, where the table
    // gives its number, rather than flatten the ratio against the limit
    const seen = [...s.ratio, ...s.aa, ...s.bb].filter((v) => v !== null);
    const top = Math.ceil(Math.max(limit * 1.5, ...seen) * 11) / 10;
    draw(container, `${phase}: G2 time ratio, ${cls} texts`, [
      line("ratio", s.n, s.ratio, COLORS[0]),
      line("upper 95%", s.n, s.upper, COLORS[1]),
      line(`limit ${limit}`, s.n, lim, "#111827", true),
      line("A/A floor", s.n, s.aa, COLORS[2], true),
      line("B/B floor", s.n, s.bb, COLORS[3], true),
    ], "timed batches (log scale)", false, true, top);
  }
}

function sampleCharts(container, samples) {
  if (!samples.length) return;
  const ts = samples.map((p) => p.t);
  const pick = (k) => samples.map((p) => (p[k] === undefined ? null : p[k]));
  draw(container, "cosine agreement (this server, since start)", [
    line("min", ts, pick("cosine_min"), COLORS[1]),
    line("mean", ts, pick("cosine_mean"), COLORS[0]),
  ], "time (UTC)", true);
  draw(container, "pooled time ratio and A/A floor (this server, since start)", [
    line("ratio", ts, pick("ratio"), COLORS[0]),
    line("upper 95%", ts, pick("upper"), COLORS[1]),
    line("A/A floor", ts, pick("aa"), COLORS[2], true),
  ], "time (UTC)", true);
  const skip = new Set(["t", "cosine_min", "cosine_mean", "ratio", "upper", "aa"]);
  const keys = [...new Set(samples.flatMap((p) => Object.keys(p)))].filter((k) => !skip.has(k));
  draw(container, "batches: sampled, skipped, dropped, failed (cumulative)",
    keys.map((k, i) => line(k, ts, pick(k), COLORS[i % COLORS.length])), "time (UTC)", true);
}

function drawAll() {
  for (const container of document.querySelectorAll(".charts")) {
    const data = JSON.parse(container.previousElementSibling.textContent);
    ratioCharts(container, data.ratio || {}, data.limit, "shadow");
    ratioCharts(container, data.watch || {}, data.limit, "watch");
    sampleCharts(container, data.samples || []);
    if (!container.children.length) {
      container.textContent = "No evidence yet: the charts fill as sampled traffic is compared.";
    }
    container.dataset.drawn = String(container.querySelectorAll("canvas").length);
  }
}

window.addEventListener("DOMContentLoaded", () => {
  if (document.querySelector(".charts") && window.Chart) drawAll();
});
