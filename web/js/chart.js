// The SVG line chart of the job, comparison and sweep pages, drawn by hand
// so that the page needs nothing but the browser.

import { svg } from "./dom.js";

// An SVG line chart of `series` ([{name, color, points: [[x, y]], job?,
// width?}]). `opts`: yMin/yMax (fixed bounds), percent (y as %), legend
// (false: the caller draws one in HTML, as the comparison does for many
// series), vlines ([{x, label}]: dashed markers such as a sweep's rungs),
// fit (the y axis spans the points, not from 0, within yMin/yMax: curves
// that end close together stay apart), W/H (another viewBox).
export function lineChart(root, series, opts) {
  const W = opts.W || 480, H = opts.H || 220, L = 48, R = 12, T = 12, B = 40;
  const all = series.flatMap((s) => s.points).filter((p) => isFinite(p[1]));
  root.replaceChildren();
  root.dataset.points = String(series.length ? series[0].points.length : 0);
  root.dataset.series = String(series.filter((s) => s.points.some((p) => isFinite(p[1]))).length);
  if (!all.length) {
    root.append(svg("text", { x: W / 2, y: H / 2, "text-anchor": "middle" }, "no points yet"));
    return;
  }
  const marks = (opts.vlines || []).map((v) => v.x);
  let x0 = Math.min(...all.map((p) => p[0])), x1 = Math.max(...all.map((p) => p[0]), ...marks);
  let y0 = opts.yMin ?? Math.min(...all.map((p) => p[1])), y1 = opts.yMax ?? Math.max(...all.map((p) => p[1]));
  if (opts.fit) {
    const lo = Math.min(...all.map((p) => p[1])), hi = Math.max(...all.map((p) => p[1])), pad = (hi - lo) * 0.08 || 0.01;
    y0 = Math.max(opts.yMin ?? -Infinity, lo - pad);
    y1 = Math.min(opts.yMax ?? Infinity, hi + pad);
  }
  if (x1 === x0) x1 = x0 + 1;
  if (y1 === y0) { y1 = y0 + 1; }
  if (opts.yMin === undefined && !opts.fit) y0 = Math.min(0, y0);
  const sx = (x) => L + ((x - x0) / (x1 - x0)) * (W - L - R);
  const sy = (y) => T + (1 - (y - y0) / (y1 - y0)) * (H - T - B);
  for (let i = 0; i <= 4; i++) {
    const y = y0 + ((y1 - y0) * i) / 4;
    root.append(svg("line", { class: "grid", x1: L, x2: W - R, y1: sy(y), y2: sy(y) }));
    root.append(svg("text", { x: L - 6, y: sy(y) + 4, "text-anchor": "end" }, opts.percent ? (y * 100).toFixed(y1 - y0 < 0.1 ? 1 : 0) + "%" : y.toPrecision(3)));
  }
  for (let i = 0; i <= 4; i++) {
    const x = x0 + ((x1 - x0) * i) / 4;
    root.append(svg("text", { x: sx(x), y: H - B + 16, "text-anchor": "middle" }, String(Math.round(x))));
  }
  root.append(svg("line", { class: "axis", x1: L, x2: L, y1: T, y2: H - B }));
  root.append(svg("line", { class: "axis", x1: L, x2: W - R, y1: H - B, y2: H - B }));
  root.append(svg("text", { x: W - R, y: H - 6, "text-anchor": "end" }, "step"));
  for (const v of opts.vlines || []) {
    if (v.x < x0 || v.x > x1) continue;
    root.append(svg("line", { class: "rung", "data-rung": v.x, x1: sx(v.x), x2: sx(v.x), y1: T, y2: H - B }));
    root.append(svg("text", { class: "rung-label", x: sx(v.x) + 3, y: H - B - 4 }, v.label));
  }
  let lx = L + 4;
  for (const s of series) {
    const pts = s.points.filter((p) => isFinite(p[1]));
    if (!pts.length) continue;
    root.append(svg("polyline", { class: "series", stroke: s.color, "stroke-width": s.width, "data-series": s.name, "data-job": s.job, points: pts.map((p) => `${sx(p[0]).toFixed(1)},${sy(p[1]).toFixed(1)}`).join(" ") }));
    if (pts.length === 1) root.append(svg("circle", { cx: sx(pts[0][0]), cy: sy(pts[0][1]), r: 3, fill: s.color }));
    if (opts.legend === false) continue;
    root.append(svg("rect", { x: lx, y: H - 14, width: 10, height: 3, fill: s.color }));
    root.append(svg("text", { class: "legend", x: lx + 14, y: H - 10 }, s.name));
    lx += 24 + s.name.length * 6.5;
  }
}
