// The job page's cluster map: GET /v1/jobs/ID/assignments drawn as PS
// shards over workers or as the ring, with each executor's colour. Apart
// from job.js because it is a drawing of its own, not the page's wiring.

import { el, svg } from "./dom.js";
import { PALETTE, TERMINAL } from "./widgets.js";

// The cluster map: PS shards over workers, or the ring in rank order; each
// role coloured and labelled by the executor it runs on.
export function drawCluster(root, a) {
  root.replaceChildren();
  root.dataset.generation = String(a.generation);
  const roles = a.parameter_servers.length + a.workers.length;
  if (!roles) {
    root.append(el("p", { class: "muted", text: TERMINAL.has(a.state) ? `The job has ended (${a.state}); it holds no executors.` : "Not placed yet: waiting for executors that fit the job's minimum set of roles." }));
    return;
  }
  const colors = new Map();
  const color = (ex) => { if (!colors.has(ex.id)) colors.set(ex.id, PALETTE[colors.size % PALETTE.length]); return colors.get(ex.id); };
  [...a.parameter_servers.map((s) => s.executor), ...a.workers.map((w) => w.executor)].forEach(color);
  const box = (x, y, w, h, ex, title, lines, data) => {
    const g = svg("g", Object.assign({ class: "node" }, data));
    g.append(svg("title", {}, title));
    g.append(svg("rect", { x, y, width: w, height: h, rx: 6, fill: "#fff", stroke: color(ex), "stroke-width": ex.state === "live" ? 2.5 : 2, "stroke-dasharray": ex.state === "live" ? null : "5 3" }));
    g.append(svg("rect", { x, y, width: 6, height: h, rx: 2, fill: color(ex) }));
    lines.forEach((t, i) => g.append(svg("text", { x: x + 14, y: y + 18 + i * 15, class: i ? "sub" : null }, t)));
    return g;
  };
  const W = 960;
  let s;
  if (a.strategy !== "allreduce") {
    const n = a.parameter_servers.length, m = a.workers.length;
    const bw = Math.min(200, (W - 40) / Math.max(n, m, 1) - 16), bh = 58;
    const H = 250;
    s = svg("svg", { class: "cluster", viewBox: `0 0 ${W} ${H}`, "data-kind": "parameter_server" });
    const px = (i, k) => (W - (k * (bw + 16) - 16)) / 2 + i * (bw + 16);
    const psY = 16, wY = H - bh - 16;
    for (const [i] of a.parameter_servers.entries()) for (const [j] of a.workers.entries())
      s.append(svg("line", { class: "link", x1: px(i, n) + bw / 2, y1: psY + bh, x2: px(j, m) + bw / 2, y2: wY }));
    a.parameter_servers.forEach((p, i) => {
      const ranges = p.ranges.map((r) => `${r.param}[${r.start}:${r.end})`);
      s.append(box(px(i, n), psY, bw, bh, p.executor, `PS shard ${p.shard} on ${p.executor.name} (${p.executor.state})\n${ranges.join("\n")}`,
        [`PS shard ${p.shard}`, `on ${p.executor.name}`, `${p.elements.toLocaleString()} params · ${p.ranges.length} range${p.ranges.length === 1 ? "" : "s"}`],
        { "data-role": "ps", "data-index": p.shard, "data-executor": p.executor.name }));
    });
    a.workers.forEach((w, j) => {
      s.append(box(px(j, m), wY, bw, bh, w.executor, `worker ${w.rank} on ${w.executor.name} (${w.executor.state}), device ${w.device}`,
        [`worker ${w.rank}`, `on ${w.executor.name}`, `device ${w.device} · pulls ${n} shard${n === 1 ? "" : "s"}`],
        { "data-role": "worker", "data-index": w.rank, "data-executor": w.executor.name }));
    });
    root.append(s);
    const table = el("table", { class: "grid ranges" }, el("thead", {}, el("tr", {}, el("th", { text: "shard" }), el("th", { text: "executor" }), el("th", { text: "parameter ranges (flattened tensor elements)" }))),
      el("tbody", {}, a.parameter_servers.map((p) => el("tr", {}, el("td", { text: String(p.shard) }), el("td", { text: `${p.executor.name} (${p.executor.state})` + (p.standby ? ` · standby on ${p.standby.name} (${p.standby.state})` : "") }),
        el("td", { text: p.ranges.map((r) => `${r.param} [${r.start}, ${r.end})`).join(", ") })))));
    root.append(table);
  } else {
    const m = a.workers.length;
    const H = m > 1 ? 330 : 140, cx = W / 2, cy = H / 2, r = m > 1 ? 115 : 0, bw = 170, bh = 52;
    s = svg("svg", { class: "cluster", viewBox: `0 0 ${W} ${H}`, "data-kind": "allreduce" });
    s.append(svg("defs", {}, svg("marker", { id: "arrow", viewBox: "0 0 10 10", refX: 9, refY: 5, markerWidth: 7, markerHeight: 7, orient: "auto-start-reverse" }, svg("path", { d: "M 0 0 L 10 5 L 0 10 z", fill: "#6f8fd0" }))));
    const pos = (i) => { const t = -Math.PI / 2 + (2 * Math.PI * i) / m; return [cx + 2.1 * r * Math.cos(t), cy + r * Math.sin(t)]; };
    // Each hop is an arc bowed away from the centre, so that the two hops
    // of a two-rank ring do not lie on top of each other.
    if (m > 1) for (let i = 0; i < m; i++) {
      const [x1, y1] = pos(i), [x2, y2] = pos((i + 1) % m);
      const dx = x2 - x1, dy = y2 - y1, len = Math.hypot(dx, dy) || 1;
      let nx = -dy / len, ny = dx / len;
      const mx = (x1 + x2) / 2, my = (y1 + y2) / 2;
      if ((mx + nx - cx) ** 2 + (my + ny - cy) ** 2 < (mx - cx) ** 2 + (my - cy) ** 2) { nx = -nx; ny = -ny; }
      const bow = m === 2 ? 150 : 40;
      const qx = mx + nx * bow, qy = my + ny * bow;
      // Leave and enter the boxes at their edges, towards the control point.
      const edge = (x, y) => {
        const ex = qx - x, ey = qy - y;
        const t = Math.min((bw / 2 + 4) / Math.abs(ex || 1e-9), (bh / 2 + 4) / Math.abs(ey || 1e-9));
        return [x + ex * t, y + ey * t];
      };
      const [ax, ay] = edge(x1, y1), [bx, by] = edge(x2, y2);
      s.append(svg("path", { class: "ringlink", d: `M ${ax.toFixed(1)} ${ay.toFixed(1)} Q ${qx.toFixed(1)} ${qy.toFixed(1)} ${bx.toFixed(1)} ${by.toFixed(1)}` }));
    }
    a.workers.forEach((w, i) => {
      const [x, y] = pos(i);
      s.append(box(x - bw / 2, y - bh / 2, bw, bh, w.executor, `rank ${w.rank} on ${w.executor.name} (${w.executor.state}), device ${w.device}`,
        [`rank ${w.rank}`, `on ${w.executor.name}`, `device ${w.device}${m > 1 ? ` → rank ${(w.rank + 1) % m}` : " · single worker"}`],
        { "data-role": "worker", "data-index": w.rank, "data-executor": w.executor.name }));
    });
    root.append(s);
  }
  const legend = el("div", { class: "cluster-legend" });
  const seen = new Map();
  for (const ex of [...a.parameter_servers.map((p) => p.executor), ...a.workers.map((w) => w.executor)]) seen.set(ex.id, ex);
  for (const ex of seen.values()) legend.append(el("span", {}, el("i", { style: "background:" + color(ex) }), `${ex.name} (${ex.address}, ${ex.state})`));
  root.append(legend);
}
