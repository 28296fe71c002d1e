// Pure chart logic for the SJD-PAC Sampler node (no ComfyUI imports, so Node.js can test it).
// ComfyUI also loads this file as an extension module; it only exports functions.

export const MAX_BARS = 400;

/** A fresh chart state. */
export function emptyChart() {
  return { accepted: [], compression: [], committed: 0, numTokens: 0, passes: 0, method: "", image: 0, batch: 1,
           budget: null, done: false };
}

/** Fold one "sjd_pac.progress" message into the chart state; returns the state. */
export function applyProgress(chart, msg) {
  if (!chart || msg.reset) chart = emptyChart();
  let total = chart.accepted.reduce((a, b) => a + b, 0);
  for (const n of msg.accepted || []) {
    chart.accepted.push(n);
    total += n;
    chart.compression.push(total / chart.accepted.length);
  }
  if (chart.accepted.length > MAX_BARS) {
    const drop = chart.accepted.length - MAX_BARS;
    chart.accepted.splice(0, drop);
    chart.compression.splice(0, drop);
  }
  chart.committed = msg.committed ?? chart.committed;
  chart.numTokens = msg.num_tokens ?? chart.numTokens;
  chart.passes = msg.passes ?? chart.passes;
  chart.method = msg.method ?? chart.method;
  chart.image = msg.image ?? chart.image;
  chart.batch = msg.batch_size ?? chart.batch;
  chart.stepCompression = msg.step_compression ?? chart.stepCompression;
  chart.budget = msg.budget ?? chart.budget; // node_budget auto: what its last pass picked
  chart.done = !!msg.done && chart.image + 1 >= chart.batch;
  return chart;
}

/** One status line under the chart. */
export function chartLabel(chart) {
  if (!chart || !chart.accepted.length) return "SJD-PAC: tokens accepted per pass appear here while sampling";
  const img = chart.batch > 1 ? ` · image ${chart.image + 1}/${chart.batch}` : "";
  const sc = (chart.stepCompression ?? 0).toFixed(2);
  const budget = chart.budget ? ` · auto budget ${chart.budget}` : "";
  return `${chart.method} · pass ${chart.passes} · ${chart.committed}/${chart.numTokens} tokens · ${sc}x${budget}${img}${chart.done ? " · done" : ""}`;
}

/** Draw the chart into the rectangle (x, y, w, h) of a 2D canvas context. */
export function drawChart(ctx, chart, x, y, w, h) {
  ctx.save();
  ctx.fillStyle = "#1b1b1f";
  ctx.fillRect(x, y, w, h);
  ctx.strokeStyle = "#444";
  ctx.strokeRect(x + 0.5, y + 0.5, w - 1, h - 1);
  const pad = 4, labelH = 14;
  const px = x + pad, py = y + pad, pw = w - 2 * pad, ph = h - 2 * pad - labelH;
  if (chart && chart.accepted.length && pw > 0 && ph > 0) {
    const peak = Math.max(1, ...chart.accepted);
    const bw = pw / chart.accepted.length;
    ctx.fillStyle = "#78d28c";
    chart.accepted.forEach((n, i) => {
      const bh = (ph * n) / peak;
      ctx.fillRect(px + i * bw, py + ph - bh, Math.max(1, bw - (bw > 3 ? 1 : 0)), bh);
    });
    ctx.strokeStyle = "#faaa3c";
    ctx.lineWidth = 2;
    ctx.beginPath();
    chart.compression.forEach((c, i) => {
      const cx = px + (i + 0.5) * bw, cy = py + ph - (ph * Math.min(c, peak)) / peak;
      if (i === 0) ctx.moveTo(cx, cy); else ctx.lineTo(cx, cy);
    });
    ctx.stroke();
    ctx.fillStyle = "#aaa";
    ctx.font = "10px sans-serif";
    ctx.fillText(String(peak), px + 2, py + 10);
  }
  ctx.fillStyle = "#ddd";
  ctx.font = "11px sans-serif";
  ctx.fillText(chartLabel(chart), px, y + h - pad - 2, pw);
  ctx.restore();
}

export const SUMMARY_LINE_HEIGHT = 14;
export const SUMMARY_FONT = "11px monospace";
export const SUMMARY_CHAR_WIDTH = 6.7; // 11px monospace in the usual fonts; draw() measures the real one

/**
 * The SJD Stats summary laid out for a widget `width` px wide: every line (long ones wrapped at
 * words, none cut off) and the height they need.
 */
export function summaryLayout(text, width, charWidth = SUMMARY_CHAR_WIDTH) {
  const lines = wrapText(text, Math.max(20, Math.floor((width - 20) / (charWidth || SUMMARY_CHAR_WIDTH))));
  return { lines, height: lines.length * SUMMARY_LINE_HEIGHT + 8 };
}

/** Split a summary into lines that fit `maxChars` characters (a longer word gets a line of its own). */
export function wrapText(text, maxChars) {
  const out = [];
  for (const para of String(text || "").split("\n")) {
    let line = "";
    for (const word of para.split(" ")) {
      if (line && (line + " " + word).length > maxChars) { out.push(line); line = word; }
      else line = line ? line + " " + word : word;
    }
    out.push(line);
  }
  return out;
}
