// One job (#/jobs/ID): facts and spec, progress and curves, the ranks'
// heartbeats, the cluster map, the timeline, checkpoints and weights, the
// model's tensors and the logs; each part is refetched when an event names
// this job (or, for the cluster, any executor).

import { $, el, mount } from "../dom.js";
import { bytes, clock, fmt, short } from "../format.js";
import { confirmingButton, expectedSteps, setProgress, TERMINAL } from "../widgets.js";
import { api, debounced } from "../api.js";
import { lineChart } from "../chart.js";
import { drawCluster } from "../cluster.js";

// A sharded dataset's loader figures over the points shown: bytes read
// per step, cache hit rate, shards prefetched ahead (nothing for data in
// memory).
function dataLine(pts) {
  const read = pts.filter((p) => p.data_bytes_read > 0 || (p.cache_hit_rate !== null && p.cache_hit_rate !== undefined));
  if (!read.length) return "";
  const mb = read.reduce((s, p) => s + p.data_bytes_read, 0) / pts.length / 1e6;
  const rates = read.filter((p) => p.cache_hit_rate !== null && p.cache_hit_rate !== undefined);
  const hit = rates.length ? ` · cache hits ${((rates.reduce((s, p) => s + p.cache_hit_rate, 0) / rates.length) * 100).toFixed(0)}%` : "";
  const depth = pts[pts.length - 1].prefetch_depth || 0;
  return ` · data read ${mb.toFixed(2)} MB/step${hit} · prefetched ${depth.toFixed(1)} shards ahead`;
}

export function jobView(main, id) {
  mount(main, "tpl-job");
  let job = null, events = [], lastEvent = 0, lastLog = 0, logLines = [];
  const cancelButton = $("#cancel-button");

  const disposeCancel = confirmingButton(cancelButton, "Cancel job", async () => {
    job = await api(`/v1/jobs/${id}/cancel`, { method: "POST" }); renderJob(); refreshAll();
  });

  const renderJob = () => {
    if (!job || !$("#job-name")) return;
    $("#job-name").textContent = job.name;
    const badge = $("#job-state");
    badge.textContent = job.state;
    badge.className = "state " + job.state;
    badge.dataset.state = job.state;
    $("#job-reason").textContent = job.state_reason;
    cancelButton.hidden = TERMINAL.has(job.state);
    const s = job.spec;
    const facts = [
      ["id", job.id], ["strategy", job.strategy], ["generation", job.generation],
      ["workers", s.workers.min === s.workers.max ? s.workers.min : `${s.workers.min}–${s.workers.max}`],
      job.strategy !== "allreduce" ? ["PS shards", s.parameter_servers] : null,
      job.estimate ? ["parameters", job.estimate.parameters.toLocaleString()] : null,
      ["submitted", new Date(job.created_at).toLocaleString()],
      job.finished_at ? ["ended", new Date(job.finished_at).toLocaleString()] : null,
      job.sweep ? ["sweep", el("a", { id: "job-sweep", href: "#/sweeps/" + job.sweep.id, text: `${short(job.sweep.id)}, trial ${job.sweep.trial}` })] : null,
    ].filter(Boolean);
    $("#job-facts").replaceChildren(...facts.map(([k, v]) => el("span", {}, el("b", { text: k + " " }), v instanceof Node ? v : String(v))));
    $("#job-spec").textContent = JSON.stringify(job.spec, null, 2);
  };

  const renderMetrics = (series) => {
    if (!job || !$("#loss-chart")) return;
    const pts = series.points;
    const step = series.steps_recorded;
    const total = expectedSteps(job.spec);
    const bar = $("#job-progress-fill").parentElement;
    setProgress(bar, step, total, job.state);
    const last = pts.length ? pts[pts.length - 1] : null;
    let text = total ? `step ${step} of ${total}` : `step ${step}`;
    if (last) text += ` · loss ${fmt(last.loss)}`;
    const lastEval = [...pts].reverse().find((p) => p.eval_accuracy !== null && p.eval_accuracy !== undefined);
    if (lastEval) text += ` · held-out accuracy ${(lastEval.eval_accuracy * 100).toFixed(1)}%`;
    $("#job-progress-text").textContent = text;
    $("#job-throughput").textContent = last
      ? `${Math.round(last.samples_per_sec).toLocaleString()} samples/s · per step: data ${(last.data_seconds * 1000).toFixed(2)} ms, compute ${(last.compute_seconds * 1000).toFixed(2)} ms, communication ${(last.comm_seconds * 1000).toFixed(2)} ms${dataLine(pts)}`
      : "no steps recorded yet";
    renderRanks(series.ranks || []);
    lineChart($("#loss-chart"), [
      { name: "training loss", color: "#2f6fde", points: pts.map((p) => [p.step, p.loss]) },
      { name: "held-out loss", color: "#e07b00", points: pts.filter((p) => p.eval_loss !== null && p.eval_loss !== undefined).map((p) => [p.step, p.eval_loss]) },
    ], {});
    lineChart($("#acc-chart"), [
      { name: "held-out accuracy", color: "#2e7d32", points: pts.filter((p) => p.eval_accuracy !== null && p.eval_accuracy !== undefined).map((p) => [p.step, p.eval_accuracy]) },
    ], { yMin: 0, yMax: 1, percent: true });
  };

  // Each worker rank of the current generation, as its heartbeat said:
  // what it is doing, its step time, and whether it straggles.
  const renderRanks = (ranks) => {
    const box = $("#ranks");
    if (!box) return;
    if (!ranks.length || TERMINAL.has(job.state)) { box.replaceChildren(); return; }
    const ms = (x) => (x < 10 ? x.toFixed(2) : x.toFixed(1)) + " ms";
    box.replaceChildren(el("table", { id: "rank-table", class: "grid" },
      el("tr", {}, el("th", { text: "rank" }), el("th", { text: "executor" }), el("th", { text: "step" }),
        el("th", { text: "doing" }), el("th", { text: "median step" }), el("th", { text: "own work / step" }), el("th", { text: "" })),
      ...ranks.map((r) => el("tr", { "data-rank": r.rank, class: r.straggler ? "straggler" : "" },
        el("td", { class: "num", text: String(r.rank) }),
        el("td", { text: r.executor_name }),
        el("td", { class: "num", text: String(r.step) }),
        el("td", { text: `${r.phase} ${r.phase_seconds >= 1 ? "for " + r.phase_seconds.toFixed(1) + " s" : ""}` }),
        el("td", { class: "num", text: ms(r.median_step_seconds * 1000) }),
        el("td", { class: "num", text: ms(r.busy_ms) }),
        el("td", r.straggler ? { class: "flag", text: "straggler", title: `own work per step at least ${job.spec.watchdog ? job.spec.watchdog.straggler_factor : 2}× the other ranks' median over ${r.window_steps} steps` } : { text: "" })))));
  };

  const renderEvents = () => {
    const list = $("#timeline");
    if (!list) return;
    list.replaceChildren(...events.map((e) => {
      let what = e.reason;
      if (e.kind === "transition") what = `${e.from_state} → ${e.to_state}: ${e.reason}`;
      if (e.kind === "placement" && e.data && e.data.generation !== undefined) what = `generation ${e.data.generation}: ${e.reason}`;
      const li = el("li", { "data-kind": e.kind, "data-to": e.to_state || "" },
        el("span", { class: "muted", text: clock(e.at) }),
        el("span", { class: "kind " + e.kind, text: e.kind }),
        el("span", { text: what }));
      return li;
    }));
    list.scrollTop = list.scrollHeight;
    renderCheckpoints();
  };

  let checkpoints = null;
  const renderCheckpoints = () => {
    const box = $("#checkpoints");
    if (!box || !job) return;
    const result = [...events].reverse().find((e) => e.kind === "result");
    const every = job.spec.checkpoint;
    const plan = every ? `The spec asks for a checkpoint ${every.every_steps ? "every " + every.every_steps + " steps" : every.every_seconds ? "every " + every.every_seconds + " s" : "at the end"}, keeping ${every.keep}.` : "";
    const url = result && result.data && result.data.weights_url;
    const scripted = job.spec.model && job.spec.model.kind === "torchscript";
    const rows = (checkpoints && checkpoints.checkpoints) || [];
    const table = rows.length
      ? el("table", { id: "checkpoint-table", class: "grid" },
          el("tr", {}, el("th", { text: "step" }), el("th", { text: "shards" }), el("th", { text: "size" }), el("th", { text: "committed" })),
          ...rows.map((c) => el("tr", { "data-step": c.step, title: c.manifest_url },
            el("td", { text: String(c.step) }), el("td", { text: String(c.shards) }),
            el("td", { text: c.bytes < 2 ** 20 ? Math.ceil(c.bytes / 1024) + " KiB" : bytes(c.bytes) }), el("td", { text: clock(c.committed_at) }))))
      : el("p", { class: "muted", text: "No committed checkpoint yet." });
    box.replaceChildren(
      el("p", { class: "muted", text: plan }),
      table,
      url
        ? el("p", {}, "Final weights: ", el("a", { href: `/v1/jobs/${id}/model`, id: "weights-link", text: url, download: `${id}.safetensors` }))
        : el("p", { class: "muted", text: TERMINAL.has(job.state) ? "No weights were written." : "Final weights appear here when the job succeeds." }),
      ...(url && scripted
        ? [el("p", {}, "Trained TorchScript module: ", el("a", { href: `/v1/jobs/${id}/model?format=torchscript`, id: "torchscript-link", text: "model.pt", download: `${id}.pt` }))]
        : []),
    );
  };

  // The model's tensors (GET /v1/jobs/ID/tensors): what training moves
  // (parameters), carries with them (buffers) and leaves alone (frozen).
  let tensors = null;
  const MAX_TENSOR_ROWS = 500;
  const renderTensors = () => {
    const box = $("#tensors");
    if (!box || !tensors) return;
    const n = (x) => x.toLocaleString();
    $("#tensor-summary").textContent = tensors.source === "pending" ? "" :
      `${n(tensors.count)} tensors · ${n(tensors.parameters)} trainable parameters · ${n(tensors.buffers)} buffer elements · ${n(tensors.frozen)} frozen`;
    if (tensors.source === "pending") {
      const ended = job && TERMINAL.has(job.state);
      box.replaceChildren(el("p", { class: "muted", text: ended ? "The TorchScript module was never inspected: its tensors are unknown." : "The TorchScript module's tensors are listed once an executor has inspected it." }));
      return;
    }
    const rows = tensors.tensors.slice(0, MAX_TENSOR_ROWS);
    const kindOf = (t) => t.kind || "parameter";
    const dtypeOf = (t) => t.dtype || "float32";
    box.replaceChildren(
      el("table", { id: "tensor-table", class: "grid" },
        el("tr", {}, el("th", { text: "name" }), el("th", { text: "shape" }), el("th", { text: "kind" }), el("th", { text: "dtype" })),
        ...rows.map((t) => el("tr", { "data-tensor": t.name, "data-kind": kindOf(t), "data-dtype": dtypeOf(t) },
          el("td", {}, el("code", { text: t.name })),
          el("td", { class: "num", text: t.shape.length ? `[${t.shape.join(", ")}]` : "scalar" }),
          el("td", { class: "kind-" + kindOf(t), text: kindOf(t) }),
          el("td", { text: dtypeOf(t) })))),
      ...(tensors.count > rows.length ? [el("p", { class: "muted", text: `and ${n(tensors.count - rows.length)} more` })] : []),
    );
  };
  const refreshTensors = debounced(async () => {
    // A model's tensors change once, when a TorchScript module is inspected.
    if (tensors && tensors.source !== "pending") return;
    tensors = await api(`/v1/jobs/${id}/tensors`);
    renderTensors();
  }, 300);
  const refreshCheckpoints = debounced(async () => {
    checkpoints = await api(`/v1/jobs/${id}/checkpoints`);
    renderCheckpoints();
  }, 500);

  const renderLogs = () => {
    const pre = $("#logs");
    if (!pre) return;
    const stick = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    pre.replaceChildren(...logLines.map((l) => el("div", { class: l.level },
      `${clock(l.at)} ${l.role}${l.index} g${l.generation} ${l.message}`)));
    if (!logLines.length) pre.textContent = "(no log lines yet)";
    if (stick) pre.scrollTop = pre.scrollHeight;
  };

  const refreshJob = debounced(async () => {
    job = await api(`/v1/jobs/${id}`);
    renderJob();
    const page = await api(`/v1/jobs/${id}/events?after=${lastEvent}&limit=1000`);
    if (page.events.length) {
      events = events.concat(page.events);
      lastEvent = events[events.length - 1].id;
    }
    renderEvents();
  }, 100);
  const refreshCluster = debounced(async () => {
    const a = await api(`/v1/jobs/${id}/assignments`);
    drawCluster($("#cluster"), a);
    $("#cluster-generation").textContent = a.generation ? `generation ${a.generation}` : "";
  }, 150);
  const refreshMetrics = debounced(async () => {
    const series = await api(`/v1/jobs/${id}/metrics?max_points=400`);
    if (!job) job = await api(`/v1/jobs/${id}`);
    renderMetrics(series);
  }, 250);
  const refreshLogs = debounced(async () => {
    for (;;) {
      const page = await api(`/v1/jobs/${id}/logs?after=${lastLog}&limit=1000`);
      if (!page.lines.length) break;
      logLines = logLines.concat(page.lines).slice(-2000);
      lastLog = page.lines[page.lines.length - 1].id;
      if (!page.next_after) break;
    }
    renderLogs();
  }, 300);
  const refreshAll = () => { refreshJob(); refreshCluster(); refreshMetrics(); refreshLogs(); refreshCheckpoints(); refreshTensors(); };
  refreshAll();
  return {
    onEvent(kind, data) {
      if (kind === "ready" || kind === "resync") refreshAll();
      else if (kind === "job" && data.id === id) refreshAll();
      else if (kind === "progress" && data.job === id) { refreshMetrics(); refreshLogs(); refreshCheckpoints(); }
      else if (kind === "executor") refreshCluster();
    },
    dispose() { disposeCancel(); },
  };
}
