// Sweeps: the list (#/sweeps) and one sweep (#/sweeps/ID) with its trials,
// their metric over steps against the early-stopping rungs, the best trial
// and the growths onto freed executors. One module for both pages, which
// share how a sweep's metric and trials are written.

import { $, el, mount } from "../dom.js";
import { age, clock, fmt, short } from "../format.js";
import { confirmingButton, PALETTE, stateBadge } from "../widgets.js";
import { api, debounced } from "../api.js";
import { lineChart } from "../chart.js";

const SWEEP_TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

function metricText(name, v) {
  if (v === null || v === undefined) return "–";
  return name === "eval_accuracy" ? (v * 100).toFixed(2) + "%" : fmt(v);
}

function trialCounts(sweep) {
  const by = {};
  for (const t of sweep.trials) by[t.state] = (by[t.state] || 0) + 1;
  return Object.entries(by).map(([k, n]) => `${n} ${k}`).join(", ");
}

export function sweepsView(main) {
  mount(main, "tpl-sweeps");
  const refresh = debounced(async () => {
    const list = await api("/v1/sweeps");
    const body = $("#sweeps");
    if (!body) return;
    body.replaceChildren(...list.sweeps.map((s) => el("tr", { "data-sweep": s.id, "data-state": s.state },
      el("td", {}, el("a", { href: "#/sweeps/" + s.id, text: s.name }), el("div", { class: "muted", text: short(s.id) })),
      el("td", {}, stateBadge(s.state)),
      el("td", { text: s.spec.search || "random" }),
      el("td", { text: `${s.spec.metric} (${s.spec.goal})` }),
      el("td", { text: `${s.trials.length} of ${s.spec.max_trials ?? s.trials.length}: ${trialCounts(s)}` }),
      el("td", { class: "num" }, s.best ? `${metricText(s.spec.metric, s.best.metric)} (trial ${s.best.index})` : "–"),
      el("td", { class: "num age", "data-at": s.created_at, text: age(s.created_at) }))));
    $("#sweeps-empty").hidden = list.sweeps.length > 0;
    $("#sweeps-count").textContent = list.sweeps.length ? `${list.sweeps.length}, newest first` : "";
  }, 200);
  // A sweep moves when its trials' jobs do; re-read now and then as well.
  const slow = setInterval(refresh, 5000);
  refresh();
  return {
    onEvent(kind) { if (["ready", "resync", "job", "sweep"].includes(kind)) refresh(); },
    dispose() { clearInterval(slow); },
  };
}

export function sweepView(main, id) {
  mount(main, "tpl-sweep");
  let sweep = null;
  const curves = new Map(); // job id → { state, series }
  const stale = new Set();
  const cancelButton = $("#sweep-cancel");
  const disposeCancel = confirmingButton(cancelButton, "Cancel sweep", async () => {
    sweep = await api(`/v1/sweeps/${encodeURIComponent(id)}/cancel`, { method: "POST" }); render(); refresh();
  });
  const color = (i) => PALETTE[i % PALETTE.length];

  const render = () => {
    if (!sweep || !$("#sweep-name")) return;
    const spec = sweep.spec, metric = spec.metric;
    $("#sweep-name").textContent = sweep.name;
    const badge = $("#sweep-state");
    badge.textContent = sweep.state;
    badge.className = "state " + sweep.state;
    badge.dataset.state = sweep.state;
    cancelButton.hidden = SWEEP_TERMINAL.has(sweep.state);
    $("#sweep-reason").textContent = sweep.reason || "";
    const asha = spec.early_stopping && spec.early_stopping.asha;
    const facts = [
      ["id", sweep.id], ["owner", sweep.owner], ["search", spec.search || "random"], ["metric", `${metric} (${spec.goal})`],
      ["trials", `${sweep.trials.length} of ${spec.max_trials ?? sweep.trials.length}, ${spec.concurrency ?? 1} at a time`],
      ["early stopping", asha ? `ASHA, reduction ${asha.reduction_factor}, rungs at ${sweep.rungs.join(", ")} steps` : "none"],
      ["started", new Date(sweep.created_at).toLocaleString()],
      sweep.finished_at ? ["ended", new Date(sweep.finished_at).toLocaleString()] : null,
    ].filter(Boolean);
    $("#sweep-facts").replaceChildren(...facts.map(([k, v]) => el("span", {}, el("b", { text: k + " " }), String(v))));
    const best = sweep.best;
    $("#sweep-best").replaceChildren(...(best
      ? [el("b", { text: "Best so far: " }), `trial ${best.index} · ${metric} ${metricText(metric, best.metric)} · `,
          el("code", { text: Object.entries(best.params).map(([k, v]) => `${k}=${JSON.stringify(v)}`).join(" ") }), " · ",
          best.job_id ? el("a", { id: "best-job", href: "#/jobs/" + best.job_id, text: "job " + short(best.job_id) }) : ""]
      : [el("span", { class: "muted", text: "No trial has reported the metric yet." })]));
    $("#sweep-best").dataset.trial = best ? String(best.index) : "";
    const withJobs = sweep.trials.filter((t) => t.job_id);
    const ranked = [...withJobs].sort((a, b) => {
      const va = a.metric ?? (spec.goal === "maximize" ? -Infinity : Infinity), vb = b.metric ?? (spec.goal === "maximize" ? -Infinity : Infinity);
      return spec.goal === "maximize" ? vb - va : va - vb;
    }).slice(0, PALETTE.length);
    const compare = $("#sweep-compare");
    compare.hidden = ranked.length < 2;
    compare.href = "#/compare/" + ranked.map((t) => t.job_id).join(",");
    compare.textContent = `Compare the ${ranked.length === withJobs.length ? "" : "best "}${ranked.length} trials`;

    // The metric over steps, one line per trial, the rungs dashed.
    const key = metric;
    const series = withJobs.map((t) => {
      const c = curves.get(t.job_id);
      const pts = ((c && c.series && c.series.points) || []).filter((p) => p[key] !== null && p[key] !== undefined).map((p) => [p.step, p[key]]);
      return { name: "trial " + t.index, job: t.job_id, color: color(t.index), width: best && best.index === t.index ? 3.5 : 1.5, points: pts };
    });
    $("#sweep-metric-name").textContent = metric;
    lineChart($("#sweep-chart"), series, { W: 960, H: 300, legend: false, vlines: sweep.rungs.map((r, k) => ({ x: r, label: `rung ${k}` })),
      fit: true, ...(metric === "eval_accuracy" ? { yMin: 0, yMax: 1, percent: true } : {}) });
    $("#sweep-legend").replaceChildren(...withJobs.map((t) => el("li", { "data-trial": t.index, class: best && best.index === t.index ? "best" : null },
      el("i", { class: "swatch", style: "background:" + color(t.index) }), `trial ${t.index}`)));

    // The trials: their parameters, how far they got, and why they stopped.
    const params = [...new Set(sweep.trials.flatMap((t) => Object.keys(t.params)))].sort();
    const head = el("tr", {}, el("th", { text: "trial" }), ...params.map((p) => el("th", {}, el("code", { text: p }))),
      el("th", { text: "state" }), el("th", { text: "rungs" }), ...sweep.rungs.map((r) => el("th", { class: "num", text: `@ ${r}` })),
      el("th", { class: "num", text: metric }), el("th", { class: "num", text: "step" }), el("th", { class: "num", text: "workers" }), el("th", { text: "job" }), el("th", { text: "why it stopped" }));
    $("#trials").replaceChildren(el("thead", {}, head), el("tbody", {}, sweep.trials.map((t) => el("tr", {
      "data-trial": t.index, "data-state": t.state, "data-rungs": t.rung_metrics.length, class: best && best.index === t.index ? "best" : null,
    },
    el("td", { class: "num" }, el("i", { class: "swatch", style: "background:" + color(t.index) }), String(t.index), best && best.index === t.index ? el("span", { class: "best-tag", text: " best" }) : null),
    ...params.map((p) => el("td", { class: "num", "data-param": p, text: t.params[p] === undefined ? "–" : typeof t.params[p] === "number" ? String(Number(t.params[p].toPrecision(6))) : JSON.stringify(t.params[p]) })),
    el("td", {}, stateBadge(t.state)),
    el("td", { class: "num", text: sweep.rungs.length ? `${t.rung_metrics.length} of ${sweep.rungs.length}` : "–" }),
    ...sweep.rungs.map((_, k) => el("td", { class: "num", "data-rung": k, text: k < t.rung_metrics.length ? metricText(metric, t.rung_metrics[k]) : "" })),
    el("td", { class: "num", "data-metric": "", text: metricText(metric, t.metric) }),
    el("td", { class: "num", text: t.step === null || t.step === undefined ? "–" : String(t.step) }),
    el("td", { class: "num", text: String(t.workers ?? 0) }),
    el("td", {}, t.job_id ? el("a", { href: "#/jobs/" + t.job_id, text: short(t.job_id) }) : el("span", { class: "muted", text: "not started" })),
    el("td", { class: "muted", text: t.reason || "" })))));

    const growths = sweep.growths || [];
    $("#growths-card").hidden = !growths.length;
    $("#growths").replaceChildren(...growths.map((g) => el("li", { "data-trial": g.trial },
      el("span", { class: "muted", text: clock(g.at) + " " }),
      `trial ${g.trial} grew from ${g.workers_before} to ${g.workers_after} worker${g.workers_after === 1 ? "" : "s"} onto the executors trial ${g.from_trial} freed`)));
  };

  const refresh = debounced(async () => {
    sweep = await api(`/v1/sweeps/${encodeURIComponent(id)}`);
    // Curves of the trials that moved: new, changed state, or named by a
    // progress event.
    await Promise.all(sweep.trials.filter((t) => t.job_id).map(async (t) => {
      const c = curves.get(t.job_id);
      if (c && c.state === t.state && !stale.has(t.job_id)) return;
      stale.delete(t.job_id);
      curves.set(t.job_id, { state: t.state, series: await api(`/v1/jobs/${t.job_id}/metrics?max_points=300`) });
    }));
    render();
  }, 300);
  const jobs = () => new Set(sweep ? sweep.trials.map((t) => t.job_id).filter(Boolean) : []);
  const slow = setInterval(() => { if (sweep && !SWEEP_TERMINAL.has(sweep.state)) refresh(); }, 3000);
  refresh();
  return {
    onEvent(kind, data) {
      if (kind === "progress" && jobs().has(data.job)) { stale.add(data.job); refresh(); }
      else if (kind === "resync") { for (const j of curves.keys()) stale.add(j); refresh(); }
      else if (kind === "ready" || kind === "job" || (kind === "sweep" && data.id === id)) refresh();
    },
    dispose() { disposeCancel(); clearInterval(slow); },
  };
}
