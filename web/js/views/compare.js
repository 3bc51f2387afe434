// Comparing runs (#/compare/ID,ID,…): their curves overlaid, their results
// side by side and the spec fields that differ. The address is the state, so
// it can be shared.

import { $, el, mount } from "../dom.js";
import { duration, fmt, short } from "../format.js";
import { PALETTE, stateBadge, TERMINAL } from "../widgets.js";
import { api, debounced, showError } from "../api.js";
import { lineChart } from "../chart.js";

// Leaves of a spec as dotted paths ("optimizer.lr", "model.hidden"): objects
// are walked, arrays and scalars are values (a list of hidden sizes reads
// best whole).
function flattenSpec(v, prefix = "", out = new Map()) {
  if (v && typeof v === "object" && !Array.isArray(v)) {
    const keys = Object.keys(v);
    if (!keys.length && prefix) out.set(prefix, v);
    for (const k of keys) flattenSpec(v[k], prefix ? prefix + "." + k : k, out);
  } else if (prefix) {
    out.set(prefix, v);
  }
  return out;
}

// The paths whose values are not the same in every spec (a path some specs
// lack differs too), sorted; the job's name is its column's header already.
function specDifferences(specs) {
  const flat = specs.map((s) => flattenSpec(s || {}));
  const paths = new Set(flat.flatMap((f) => [...f.keys()]));
  paths.delete("name");
  return [...paths].sort().filter((p) => new Set(flat.map((f) => JSON.stringify(f.get(p)))).size > 1)
    .map((p) => ({ path: p, values: flat.map((f) => f.get(p)) }));
}

function specValue(v) {
  if (v === undefined) return el("span", { class: "muted", text: "(not set)" });
  return typeof v === "string" ? v : JSON.stringify(v);
}

// What a run ended with (or has reached), from its curve: the last point's
// loss, held-out figures last and best.
function runSummary(job, series) {
  const pts = (series && series.points) || [];
  const evals = (key) => pts.filter((p) => p[key] !== null && p[key] !== undefined).map((p) => [p.step, p[key]]);
  const acc = evals("eval_accuracy"), el_ = evals("eval_loss");
  const pick = (list, better) => list.reduce((b, p) => (b === null || better(p[1], b[1]) ? p : b), null);
  const started = job.started_at ? Date.parse(job.started_at) : null;
  const ended = job.finished_at ? Date.parse(job.finished_at) : TERMINAL.has(job.state) ? null : Date.now();
  return {
    state: job.state,
    steps: series ? series.steps_recorded : 0,
    seconds: started !== null && ended !== null ? (ended - started) / 1000 : null,
    final_loss: pts.length ? pts[pts.length - 1].loss : null,
    last_accuracy: acc.length ? acc[acc.length - 1] : null,
    best_accuracy: pick(acc, (a, b) => a > b),
    last_eval_loss: el_.length ? el_[el_.length - 1] : null,
    best_eval_loss: pick(el_, (a, b) => a < b),
    downsampled: !!(series && series.downsampled),
  };
}

export function compareView(main, ids) {
  mount(main, "tpl-compare");
  ids = [...new Set(ids.filter(Boolean))];
  const runs = new Map(); // id → { job, series } or { error }
  const color = (i) => PALETTE[i % PALETTE.length];
  if (ids.length > PALETTE.length) showError(new Error(`Only the first ${PALETTE.length} of ${ids.length} jobs are compared.`));
  ids = ids.slice(0, PALETTE.length);
  $("#compare-count").textContent = `${ids.length} job${ids.length === 1 ? "" : "s"}`;

  const render = () => {
    if (!$("#compare-legend")) return;
    const shown = ids.map((id, i) => ({ id, i, run: runs.get(id) })).filter((r) => r.run);
    const ok = shown.filter((r) => r.run.job);
    $("#compare-legend").replaceChildren(...shown.map(({ id, i, run }) => el("li", { "data-job": id, "data-state": run.job ? run.job.state : "missing" },
      el("i", { class: "swatch", style: "background:" + color(i) }),
      run.job ? el("a", { href: "#/jobs/" + id, text: run.job.name }) : el("span", { class: "bad", text: `${short(id)}: ${run.error}` }),
      el("span", { class: "muted", text: " " + short(id) + " " }),
      run.job ? stateBadge(run.job.state) : null,
      ids.length > 1 ? el("a", { class: "remove", title: "leave this job out", href: "#/compare/" + ids.filter((x) => x !== id).join(","), text: "×" }) : null)));
    const curve = (key) => ok.map(({ id, i, run }) => ({
      name: run.job.name, job: id, color: color(i),
      points: ((run.series && run.series.points) || []).filter((p) => p[key] !== null && p[key] !== undefined).map((p) => [p.step, p[key]]),
    }));
    lineChart($("#cmp-loss"), curve("loss"), { legend: false });
    lineChart($("#cmp-acc"), curve("eval_accuracy"), { legend: false, yMin: 0, yMax: 1, percent: true, fit: true });
    lineChart($("#cmp-eval-loss"), curve("eval_loss"), { legend: false });

    // Results side by side, one column per job; the best of a row in bold.
    const sums = ok.map(({ id, run }) => ({ id, s: runSummary(run.job, run.series) }));
    const head = el("tr", {}, el("th", { text: "" }), ...ok.map(({ id, i, run }) => el("th", { "data-job": id }, el("i", { class: "swatch", style: "background:" + color(i) }), run.job.name)));
    const at = (p, digits) => (p ? `${fmt(p[1], digits)} @ ${p[0]}` : "–");
    const rows = [
      ["state", "State", (s) => stateBadge(s.state), null],
      ["steps", "Steps recorded", (s) => String(s.steps), null],
      ["duration", "Duration", (s) => duration(s.seconds), null],
      ["final_loss", "Final training loss", (s) => fmt(s.final_loss), (s) => s.final_loss, "min"],
      ["last_accuracy", "Last held-out accuracy", (s) => at(s.last_accuracy), (s) => s.last_accuracy && s.last_accuracy[1], "max"],
      ["best_accuracy", "Best held-out accuracy", (s) => at(s.best_accuracy), (s) => s.best_accuracy && s.best_accuracy[1], "max"],
      ["last_eval_loss", "Last held-out loss", (s) => at(s.last_eval_loss), (s) => s.last_eval_loss && s.last_eval_loss[1], "min"],
      ["best_eval_loss", "Best held-out loss", (s) => at(s.best_eval_loss), (s) => s.best_eval_loss && s.best_eval_loss[1], "min"],
    ];
    $("#final-metrics").replaceChildren(el("thead", {}, head), el("tbody", {}, rows.map(([key, label, show, value, goal]) => {
      const vals = value ? sums.map(({ s }) => value(s)).filter((v) => v !== null && v !== undefined && isFinite(v)) : [];
      const best = vals.length > 1 ? (goal === "min" ? Math.min(...vals) : Math.max(...vals)) : null;
      return el("tr", { "data-metric": key }, el("th", { text: label }),
        ...sums.map(({ id, s }) => el("td", { class: "num" + (best !== null && value(s) === best ? " best" : ""), "data-job": id }, show(s))));
    })));
    $("#final-note").textContent = sums.some(({ s }) => s.downsampled)
      ? "Long curves are averaged into buckets: “best” is over the held-out figures the buckets keep (each bucket's latest)."
      : "";

    // The spec fields that differ, as dotted paths.
    const diffs = specDifferences(ok.map(({ run }) => run.job.spec));
    const box = $("#spec-diff");
    if (ok.length < 2) box.replaceChildren(el("p", { class: "muted", text: "Pick two jobs or more to compare their specs." }));
    else if (!diffs.length) box.replaceChildren(el("p", { class: "muted", id: "spec-same", text: "The specs are the same (apart from their names)." }));
    else box.replaceChildren(el("table", { class: "grid compare", id: "spec-diff-table" },
      el("thead", {}, el("tr", {}, el("th", { text: "field" }), ...ok.map(({ id, i, run }) => el("th", { "data-job": id }, el("i", { class: "swatch", style: "background:" + color(i) }), run.job.name)))),
      el("tbody", {}, diffs.map((d) => el("tr", { "data-field": d.path }, el("td", {}, el("code", { text: d.path })),
        ...d.values.map((v, k) => el("td", { "data-job": ok[k].id, class: "spec-value" }, specValue(v))))))));
  };

  const load = async (id) => {
    try {
      const [job, series] = await Promise.all([api(`/v1/jobs/${encodeURIComponent(id)}`), api(`/v1/jobs/${encodeURIComponent(id)}/metrics?max_points=1000`)]);
      runs.set(id, { job, series });
    } catch (e) {
      runs.set(id, { error: e.status === 404 ? "no such job" : e.message });
    }
  };
  const stale = new Set(ids);
  const refresh = debounced(async () => {
    const todo = [...stale];
    stale.clear();
    await Promise.all(todo.map(load));
    render();
  }, 300);
  if (!ids.length) $("#compare-count").textContent = "no jobs named: tick some in the jobs list";
  refresh();
  return {
    onEvent(kind, data) {
      if (kind === "ready" || kind === "resync") ids.forEach((id) => stale.add(id));
      else if (kind === "job" && ids.includes(data.id)) stale.add(data.id);
      else if (kind === "progress" && ids.includes(data.job)) stale.add(data.job);
      else return;
      refresh();
    },
    dispose() {},
  };
}
