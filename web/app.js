// Trainyard web UI: plain JavaScript over the REST API, no build step.
//
// Views behind the URL hash (#/jobs, #/jobs/ID, #/compare/ID,ID,…,
// #/sweeps, #/sweeps/ID, #/executors, #/usage, #/submit). Live updates come from GET /v1/events/stream (server-sent
// events read with fetch, so the bearer token can go in a header): each
// event names what changed and the open view refetches just that. A 401
// from any request opens the token prompt.
"use strict";

const STATES = ["queued", "inspecting", "scheduling", "running", "recovering", "succeeded", "failed", "cancelled"];
const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);
const TOKEN_KEY = "trainyard-token";
const PICKED_KEY = "trainyard-compare";
const $ = (sel, root = document) => root.querySelector(sel);

// ---------- small helpers ----------

function el(tag, attrs = {}, ...children) {
  const e = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs)) {
    if (v === undefined || v === null || v === false) continue;
    if (k === "class") e.className = v;
    else if (k === "text") e.textContent = v;
    else if (k.startsWith("on")) e.addEventListener(k.slice(2), v);
    else e.setAttribute(k, v === true ? "" : v);
  }
  for (const c of children.flat()) if (c !== null && c !== undefined) e.append(c);
  return e;
}

const SVG_NS = "http://www.w3.org/2000/svg";
function svg(tag, attrs = {}, ...children) {
  const e = document.createElementNS(SVG_NS, tag);
  for (const [k, v] of Object.entries(attrs)) if (v !== undefined && v !== null) e.setAttribute(k, v);
  for (const c of children.flat()) if (c !== null && c !== undefined) e.append(c);
  return e;
}

function stateBadge(state) { return el("span", { class: "state " + state, text: state }); }

function age(iso) {
  const s = Math.max(0, (Date.now() - Date.parse(iso)) / 1000);
  if (s < 60) return Math.floor(s) + "s";
  if (s < 3600) return Math.floor(s / 60) + "m";
  if (s < 86400) return Math.floor(s / 3600) + "h";
  return Math.floor(s / 86400) + "d";
}

function bytes(b) {
  if (b === undefined || b === null) return "?";
  if (b >= 2 ** 30) return (b / 2 ** 30).toFixed(1) + " GiB";
  return Math.round(b / 2 ** 20) + " MiB";
}

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

function fmt(x, digits = 4) { return x === null || x === undefined || !isFinite(x) ? "–" : Number(x).toFixed(digits); }
function clock(iso) { return new Date(iso).toLocaleTimeString([], { hour12: false }); }
function short(id) { return id ? id.slice(-8) : ""; }

// Steps the job will run when the spec says (steps, or epochs over a
// generated dataset); null when only the executor knows (epochs over a file).
function expectedSteps(spec) {
  if (spec.steps) return spec.steps;
  const samples = spec.dataset && spec.dataset.samples;
  if (!spec.epochs || !samples) return null;
  const evalFraction = spec.eval_fraction ?? 0.1;
  const train = samples - Math.round(samples * evalFraction);
  const workers = Math.max(1, (spec.workers && spec.workers.max) || 1);
  return spec.epochs * Math.max(1, Math.ceil(Math.ceil(train / workers) / spec.batch_size));
}

function progressBar(step, total, state, big) {
  const bar = el("div", { class: "progress" + (big ? " big" : "") });
  const fill = el("div", { class: "fill" });
  bar.append(fill);
  setProgress(bar, step, total, state);
  return bar;
}

function setProgress(bar, step, total, state) {
  const fill = bar.firstChild;
  let frac = null;
  if (state === "succeeded") frac = 1;
  else if (total) frac = Math.min(1, step / total);
  bar.classList.toggle("unknown", frac === null && !TERMINAL.has(state) && step > 0);
  fill.style.width = frac === null ? (TERMINAL.has(state) ? "0" : "") : (frac * 100).toFixed(1) + "%";
  bar.dataset.step = step;
  bar.title = total ? `${step} / ${total} steps` : `${step} steps`;
}

// ---------- API access and the token prompt ----------

function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }
function authHeaders(extra = {}) {
  const h = Object.assign({}, extra);
  const t = token();
  if (t) h.Authorization = "Bearer " + t;
  return h;
}

let tokenPrompt = null;
function askToken(why) {
  if (tokenPrompt) return tokenPrompt;
  const dialog = $("#token-dialog");
  $("#token-why").textContent = why || (token()
    ? "The token was refused (unknown, revoked or expired). Enter your API token."
    : "This server requires a token: yours (trainyard token create), or the admin's (--admin-token). It is kept in this tab only.");
  $("#token-input").value = token();
  tokenPrompt = new Promise((resolve) => {
    const done = (ok) => {
      dialog.close();
      tokenPrompt = null;
      if (ok) sessionStorage.setItem(TOKEN_KEY, $("#token-input").value.trim());
      resolve(ok);
    };
    $("#token-form").onsubmit = (e) => { e.preventDefault(); done(true); };
    $("#token-cancel").onclick = () => done(false);
    dialog.oncancel = (e) => { e.preventDefault(); done(false); };
  });
  dialog.showModal();
  $("#token-input").focus();
  return tokenPrompt;
}

class ApiError extends Error {
  constructor(status, problem) {
    super((problem && (problem.detail || problem.title)) || "HTTP " + status);
    this.status = status;
    this.problem = problem;
  }
}

async function api(path, opts = {}) {
  for (;;) {
    const r = await fetch(path, Object.assign({}, opts, { headers: authHeaders(opts.headers) }));
    if (r.status === 401) {
      const ok = await askToken();
      if (ok) continue;
    }
    const type = r.headers.get("content-type") || "";
    const body = type.includes("json") ? await r.json() : await r.text();
    if (!r.ok) throw new ApiError(r.status, typeof body === "object" ? body : { detail: body });
    return body;
  }
}

function showError(e) {
  const box = $("#error");
  if (!e) { box.hidden = true; return; }
  box.textContent = e.message || String(e);
  box.hidden = false;
}

// Runs fn at most once per `ms`, the last call winning; returns the trigger.
function debounced(fn, ms = 150) {
  let timer = null, running = false, again = false;
  const run = async () => {
    timer = null;
    if (running) { again = true; return; }
    running = true;
    try { await fn(); showError(null); } catch (e) { showError(e); }
    running = false;
    if (again) { again = false; trigger(); }
  };
  const trigger = () => { if (!timer) timer = setTimeout(run, ms); };
  return trigger;
}

// ---------- live updates ----------

let current = null; // the mounted view: { onEvent(kind, data), dispose() }

function setLive(on) {
  const l = $("#live");
  l.textContent = on ? "live" : "offline";
  l.className = "live " + (on ? "on" : "off");
  document.body.dataset.live = on ? "1" : "0";
}

async function streamEvents() {
  for (;;) {
    try {
      const r = await fetch("/v1/events/stream", { headers: authHeaders({ Accept: "text/event-stream" }) });
      if (r.status === 401) {
        // Dismissed: wait for a token (the header's "token" button) rather
        // than asking again and again.
        const before = token();
        if (!(await askToken())) while (token() === before) await new Promise((res) => setTimeout(res, 1000));
        continue;
      }
      if (!r.ok || !r.body) throw new Error("stream: HTTP " + r.status);
      setLive(true);
      const reader = r.body.pipeThrough(new TextDecoderStream()).getReader();
      let buf = "";
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buf += value.replace(/\r\n/g, "\n");
        let cut;
        while ((cut = buf.indexOf("\n\n")) >= 0) {
          const chunk = buf.slice(0, cut);
          buf = buf.slice(cut + 2);
          let kind = "message", data = "";
          for (const line of chunk.split("\n")) {
            if (line.startsWith("event:")) kind = line.slice(6).trim();
            else if (line.startsWith("data:")) data += line.slice(5).trim();
          }
          if (chunk.startsWith(":")) continue; // keep-alive comment
          let parsed = {};
          try { parsed = data ? JSON.parse(data) : {}; } catch (_) { parsed = {}; }
          if (current) current.onEvent(kind, parsed);
        }
      }
    } catch (e) {
      console.warn("event stream", e);
    }
    setLive(false);
    await new Promise((res) => setTimeout(res, 1000));
  }
}

// ---------- routing ----------

// Who the server takes this tab for (GET /v1/whoami), beside the token button.
async function showWho() {
  try {
    const me = await api("/v1/whoami");
    $("#whoami").textContent = me.open ? "open server (admin)" : `${me.user} (${me.role})`;
  } catch (e) {
    $("#whoami").textContent = "";
  }
}

function route() {
  showWho();
  const parts = location.hash.replace(/^#\/?/, "").split("/").filter(Boolean);
  if (current) current.dispose();
  showError(null);
  const main = $("#view");
  main.replaceChildren();
  let name = parts[0] || "jobs";
  let view = parts[1] && (name === "jobs" || name === "sweeps") ? name.slice(0, -1) : name;
  if (name === "jobs" && parts[1]) current = jobView(main, decodeURIComponent(parts[1]));
  else if (name === "compare") { current = compareView(main, decodeURIComponent(parts[1] || "").split(",")); name = "jobs"; }
  else if (name === "sweeps" && parts[1]) current = sweepView(main, decodeURIComponent(parts[1]));
  else if (name === "sweeps") current = sweepsView(main);
  else if (name === "executors") current = executorsView(main);
  else if (name === "usage") current = usageView(main);
  else if (name === "submit") current = submitView(main);
  else { current = jobsView(main); name = "jobs"; view = "jobs"; }
  for (const a of document.querySelectorAll("[data-nav]")) a.classList.toggle("active", a.dataset.nav === name);
  document.body.dataset.view = view;
}

function mount(main, id) {
  main.append($("#" + id).content.cloneNode(true));
}

// ---------- jobs ----------

function jobsView(main) {
  mount(main, "tpl-jobs");
  const filter = $("#state-filter");
  for (const s of STATES) filter.add(new Option(s, s));
  filter.value = sessionStorage.getItem("trainyard-filter") || "";
  const metrics = new Map(); // job id → { state, series }
  const stale = new Set(); // jobs whose curve moved since it was read
  let jobs = [];
  // The jobs ticked for comparison, kept across filters and visits.
  const picked = new Set(JSON.parse(sessionStorage.getItem(PICKED_KEY) || "[]"));
  const compareButton = $("#compare-button"), clear = $("#compare-clear");
  const showPicked = () => {
    sessionStorage.setItem(PICKED_KEY, JSON.stringify([...picked]));
    compareButton.disabled = picked.size < 2;
    compareButton.textContent = picked.size ? `Compare ${picked.size} job${picked.size === 1 ? "" : "s"}` : "Compare";
    clear.hidden = picked.size === 0;
  };
  compareButton.addEventListener("click", () => { location.hash = "#/compare/" + [...picked].join(","); });
  clear.addEventListener("click", () => { picked.clear(); showPicked(); render(); });
  showPicked();

  const render = () => {
    const body = $("#jobs");
    if (!body) return;
    body.replaceChildren(...jobs.map((j) => {
      const m = metrics.get(j.id);
      const series = m && m.series;
      const last = series && series.points.length ? series.points[series.points.length - 1] : null;
      const step = series ? series.steps_recorded : 0;
      const total = expectedSteps(j.spec);
      const ps = j.strategy === "allreduce" ? "–" : String(j.spec.parameter_servers);
      const pick = el("input", { type: "checkbox", class: "pick", "data-job": j.id, "aria-label": "compare " + j.name, checked: picked.has(j.id) });
      pick.addEventListener("change", () => {
        if (pick.checked && picked.size >= PALETTE.length) { pick.checked = false; showError(new Error(`At most ${PALETTE.length} jobs can be compared at once.`)); return; }
        if (pick.checked) picked.add(j.id); else picked.delete(j.id);
        showPicked();
      });
      return el("tr", { "data-job": j.id, "data-state": j.state },
        el("td", { class: "pick" }, pick),
        el("td", { class: "name" }, el("a", { href: "#/jobs/" + j.id, text: j.name }), el("div", { class: "muted", text: short(j.id) }),
          j.sweep ? el("a", { class: "tag", href: "#/sweeps/" + j.sweep.id, text: `sweep trial ${j.sweep.trial}` }) : null),
        el("td", {}, stateBadge(j.state)),
        el("td", { text: j.strategy }),
        el("td", { class: "num", text: j.spec.workers.min === j.spec.workers.max ? String(j.spec.workers.min) : `${j.spec.workers.min}–${j.spec.workers.max}` }),
        el("td", { class: "num", text: ps }),
        el("td", {}, progressBar(step, total, j.state), el("span", { class: "muted", text: " " + (total ? `${step}/${total}` : step ? String(step) : "") })),
        el("td", { class: "num", text: last ? fmt(last.loss) : "–" }),
        el("td", { class: "num age", "data-at": j.created_at, text: age(j.created_at) }));
    }));
    $("#jobs-empty").hidden = jobs.length > 0;
    $("#jobs-count").textContent = jobs.length ? `${jobs.length} shown, newest first` : "";
  };

  const refresh = debounced(async () => {
    const q = filter.value ? "&state=" + encodeURIComponent(filter.value) : "";
    const page = await api("/v1/jobs?limit=100" + q);
    jobs = page.jobs;
    render();
    // Curves only of jobs that moved since we last looked: new to the
    // table, changed state, or named by a progress event.
    await Promise.all(jobs.map(async (j) => {
      const m = metrics.get(j.id);
      if (m && m.state === j.state && !stale.has(j.id)) return;
      if (j.state === "queued" || j.state === "scheduling" || j.state === "inspecting") return;
      stale.delete(j.id);
      const series = await api(`/v1/jobs/${j.id}/metrics?max_points=50`);
      metrics.set(j.id, { state: j.state, series });
    }));
    render();
  }, 200);

  filter.addEventListener("change", () => { sessionStorage.setItem("trainyard-filter", filter.value); refresh(); });
  const ticker = setInterval(() => { for (const td of document.querySelectorAll("td.age")) td.textContent = age(td.dataset.at); }, 1000);
  refresh();
  return {
    onEvent(kind, data) {
      if (kind === "progress" && data.job) stale.add(data.job);
      if (kind === "resync") for (const id of metrics.keys()) stale.add(id);
      if (["ready", "resync", "job", "progress"].includes(kind)) refresh();
    },
    dispose() { clearInterval(ticker); },
  };
}

// ---------- one job ----------

function jobView(main, id) {
  mount(main, "tpl-job");
  let job = null, events = [], lastEvent = 0, lastLog = 0, logLines = [];
  let confirmTimer = null;
  const cancelButton = $("#cancel-button");

  cancelButton.addEventListener("click", async () => {
    if (cancelButton.dataset.confirm !== "1") {
      cancelButton.dataset.confirm = "1";
      cancelButton.textContent = "Really cancel?";
      confirmTimer = setTimeout(() => { cancelButton.dataset.confirm = ""; cancelButton.textContent = "Cancel job"; }, 4000);
      return;
    }
    clearTimeout(confirmTimer);
    cancelButton.disabled = true;
    try { job = await api(`/v1/jobs/${id}/cancel`, { method: "POST" }); renderJob(); refreshAll(); }
    catch (e) { showError(e); cancelButton.disabled = false; }
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
    dispose() { clearTimeout(confirmTimer); },
  };
}

// An SVG line chart of `series` ([{name, color, points: [[x, y]], job?,
// width?}]). `opts`: yMin/yMax (fixed bounds), percent (y as %), legend
// (false: the caller draws one in HTML, as the comparison does for many
// series), vlines ([{x, label}]: dashed markers such as a sweep's rungs),
// fit (the y axis spans the points, not from 0, within yMin/yMax: curves
// that end close together stay apart), W/H (another viewBox).
function lineChart(root, series, opts) {
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

const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#e15759", "#76b7b2", "#edc948", "#9c755f", "#ff9da7", "#bab0ac"];

// The cluster map: PS shards over workers, or the ring in rank order; each
// role coloured and labelled by the executor it runs on.
function drawCluster(root, a) {
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

// ---------- comparing runs ----------

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

function duration(seconds) {
  if (seconds === null || !isFinite(seconds)) return "–";
  if (seconds < 10) return seconds.toFixed(1) + " s";
  const s = Math.round(seconds);
  if (s < 60) return s + " s";
  if (s < 3600) return `${Math.floor(s / 60)} min ${s % 60} s`;
  return `${Math.floor(s / 3600)} h ${Math.floor((s % 3600) / 60)} min`;
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

function compareView(main, ids) {
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

// ---------- sweeps ----------

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

function sweepsView(main) {
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

function sweepView(main, id) {
  mount(main, "tpl-sweep");
  let sweep = null, confirmTimer = null;
  const curves = new Map(); // job id → { state, series }
  const stale = new Set();
  const cancelButton = $("#sweep-cancel");
  cancelButton.addEventListener("click", async () => {
    if (cancelButton.dataset.confirm !== "1") {
      cancelButton.dataset.confirm = "1";
      cancelButton.textContent = "Really cancel?";
      confirmTimer = setTimeout(() => { cancelButton.dataset.confirm = ""; cancelButton.textContent = "Cancel sweep"; }, 4000);
      return;
    }
    clearTimeout(confirmTimer);
    cancelButton.disabled = true;
    try { sweep = await api(`/v1/sweeps/${encodeURIComponent(id)}/cancel`, { method: "POST" }); render(); refresh(); }
    catch (e) { showError(e); cancelButton.disabled = false; }
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
    dispose() { clearTimeout(confirmTimer); clearInterval(slow); },
  };
}

// ---------- executors ----------

// How an executor confines users' code: its state, the layers as a tooltip.
function sandboxCell(s) {
  if (!s) return el("td", { class: "sandbox muted", text: "not reported" });
  // Script jobs need the network layer too (a namespace per rank): an
  // executor that cannot make one says so beside the models' state.
  const scripts = s.scripts || s.state;
  const text = scripts === s.state ? s.state : s.state + " (scripts: " + scripts + ")";
  return el("td", {
    class: "sandbox sandbox-" + s.state,
    "data-sandbox": s.state,
    "data-sandbox-scripts": scripts,
    title: s.detail,
    text,
  });
}

function executorsView(main) {
  mount(main, "tpl-executors");
  let fetchedAt = Date.now();
  const freshness = (td) => {
    const s = Number(td.dataset.since) + (Date.now() - fetchedAt) / 1000;
    td.textContent = s < 10 ? s.toFixed(1) + " s ago" : Math.round(s) + " s ago";
    td.className = "num heartbeat " + (td.dataset.state === "live" || td.dataset.state === "draining" ? (s < 3 ? "fresh" : s < 10 ? "stale" : "dead") : "muted");
  };
  const refresh = debounced(async () => {
    const list = await api("/v1/executors");
    fetchedAt = Date.now();
    const body = $("#executors");
    if (!body) return;
    body.replaceChildren(...list.executors.map((e) => {
      const hb = el("td", { "data-since": e.seconds_since_heartbeat, "data-state": e.state });
      freshness(hb);
      const labels = Object.entries(e.labels || {}).map(([k, v]) => `${k}=${v}`).join(" ");
      return el("tr", { "data-executor": e.name, "data-state": e.state },
        el("td", {}, el("b", { text: e.name }), el("div", { class: "muted", text: short(e.id) + (labels ? " · " + labels : "") })),
        el("td", {}, stateBadge(e.state)),
        el("td", { text: e.address }),
        el("td", {}, e.resources.devices.map((d) => el("div", { text: `${d.kind}:${d.index} ${d.name} (${bytes(d.memory_bytes)})` }))),
        el("td", { text: `${e.resources.cpu_cores} cores · ${bytes(e.resources.ram_bytes)}` }),
        sandboxCell(e.sandbox),
        el("td", { class: "roles" }, e.roles.length ? e.roles.map((r) => el("a", { href: "#/jobs/" + r.job_id, title: r.job_id, text: `${r.role === "ps" ? (r.standby ? "standby of PS shard" : "PS shard") : "worker"} ${r.index} · job ${short(r.job_id)} · g${r.generation}` })) : el("span", { class: "muted", text: "idle" })),
        hb);
    }));
    $("#executors-empty").hidden = list.executors.length > 0;
    const live = list.executors.filter((e) => e.state === "live").length;
    $("#executors-count").textContent = `${live} live of ${list.executors.length}`;
    // Who starts executors, and its latest decisions with their reasons.
    const p = await api("/v1/provisioner?limit=10");
    const settings = $("#provisioner-settings");
    if (!settings) return;
    const t = p.settings;
    settings.textContent = t.kind === "none"
      ? "none: executors are started by hand"
      : `${t.kind}: at most ${t.max_executors} executor(s), ${t.max_per_job} per job, ${t.executor_cpus} CPU and ${bytes(t.executor_memory_mb * 1048576)} each; released after ${t.idle_timeout_secs} s idle`;
    $("#provisioner-events").replaceChildren(...p.events.map((e) => el("li", { "data-kind": e.kind },
      el("span", { class: "muted", text: new Date(e.at).toLocaleTimeString() + " " }),
      el("b", { text: e.kind + " " }),
      e.reason)));
  }, 150);
  const ticker = setInterval(() => document.querySelectorAll("td.heartbeat").forEach(freshness), 500);
  // Heartbeats change nothing users are notified of; re-read now and then
  // so that a silent executor's state is seen to move.
  const slow = setInterval(refresh, 5000);
  refresh();
  return {
    onEvent(kind) { if (["ready", "resync", "executor", "job"].includes(kind)) refresh(); },
    dispose() { clearInterval(ticker); clearInterval(slow); },
  };
}

// ---------- usage ----------

function usageView(main) {
  mount(main, "tpl-usage");
  const pick = $("#usage-window");
  pick.value = sessionStorage.getItem("trainyard-usage-window") || "24";
  const fixed = (v, d) => Number(v).toFixed(d);
  const refresh = debounced(async () => {
    const hours = Number(pick.value);
    const to = new Date();
    const from = new Date(to.getTime() - hours * 3600 * 1000);
    const r = await api(`/v1/usage?from=${encodeURIComponent(from.toISOString())}&to=${encodeURIComponent(to.toISOString())}`);
    const owners = $("#usage-owners");
    if (!owners) return;
    $("#usage-range").textContent = `${new Date(r.from).toLocaleString()} – ${new Date(r.to).toLocaleString()}`;
    owners.replaceChildren(...r.owners.map((o) => el("tr", { "data-owner": o.owner },
      el("td", {}, el("b", { text: o.owner })),
      el("td", { class: "num", text: String(o.jobs) }),
      el("td", { class: "num", text: fixed(o.device_seconds, 1) }),
      el("td", { class: "num", text: fixed(o.cpu_worker_seconds, 1) }),
      el("td", { class: "num", text: fixed(o.ps_ram_gib_hours, 4) }))));
    $("#usage-jobs").replaceChildren(...r.jobs.map((j) => el("tr", { "data-job": j.job_id },
      el("td", {}, el("a", { href: "#/jobs/" + j.job_id, text: j.name }), el("div", { class: "muted", text: short(j.job_id) })),
      el("td", { text: j.owner }),
      el("td", {}, stateBadge(j.state)),
      el("td", { class: "num", text: fixed(j.device_seconds, 1) }),
      el("td", { class: "num", text: fixed(j.cpu_worker_seconds, 1) }),
      el("td", { class: "num", text: fixed(j.ps_ram_gib_hours, 4) }))));
    $("#usage-empty").hidden = r.jobs.length > 0;
  }, 150);
  pick.addEventListener("change", () => { sessionStorage.setItem("trainyard-usage-window", pick.value); refresh(); });
  // Running jobs' figures grow by the second: re-read now and then.
  const slow = setInterval(refresh, 5000);
  refresh();
  return {
    onEvent(kind) { if (["ready", "resync", "job"].includes(kind)) refresh(); },
    dispose() { clearInterval(slow); },
  };
}

// ---------- submit ----------

const TEMPLATES = {
  allreduce: {
    name: "mlp-ring",
    model: { kind: "mlp", inputs: 64, hidden: [128, 64], outputs: 10 },
    dataset: { kind: "classification", samples: 4000, features: 64, classes: 10 },
    loss: "cross_entropy",
    optimizer: { kind: "adamw", lr: 0.003, weight_decay: 0.0001, schedule: { kind: "warmup_cosine", warmup_steps: 20 } },
    batch_size: 64,
    steps: 600,
    strategy: "allreduce",
    workers: { min: 2, max: 4 },
    checkpoint: { every_steps: 200, keep: 2 },
    eval_fraction: 0.2,
    seed: 7,
  },
  parameter_server: {
    name: "mlp-ps",
    model: { kind: "mlp", inputs: 64, hidden: [128, 64], outputs: 10 },
    dataset: { kind: "classification", samples: 4000, features: 64, classes: 10 },
    loss: "cross_entropy",
    optimizer: { kind: "adamw", lr: 0.002, weight_decay: 0.01, schedule: { kind: "warmup_cosine", warmup_steps: 20 } },
    batch_size: 64,
    steps: 600,
    strategy: "parameter_server",
    parameter_servers: 2,
    consistency: "sync",
    workers: { min: 2, max: 2 },
    checkpoint: { every_steps: 200, keep: 2 },
    eval_fraction: 0.2,
    seed: 7,
  },
};

// Line (0-based) of every field path in a JSON text: "optimizer.lr",
// "model.hidden[0]", "" for the whole document. Tolerant: stops at the
// first syntax error with what it found so far.
function fieldLines(text) {
  const lines = new Map([["", 0]]);
  let i = 0, line = 0;
  const n = text.length;
  const ws = () => {
    while (i < n) {
      const c = text[i];
      if (c === "\n") { line++; i++; } else if (c === " " || c === "\t" || c === "\r") i++; else break;
    }
  };
  const str = () => {
    i++;
    let s = "";
    while (i < n && text[i] !== '"') {
      if (text[i] === "\\") { s += text[i + 1] || ""; i += 2; } else { if (text[i] === "\n") line++; s += text[i++]; }
    }
    i++;
    return s;
  };
  const value = (path, depth) => {
    ws();
    if (i >= n || depth > 64) return false;
    const c = text[i];
    if (c === "{") {
      i++; ws();
      if (text[i] === "}") { i++; return true; }
      for (;;) {
        ws();
        if (text[i] !== '"') return false;
        const at = line, k = str(), p = path ? path + "." + k : k;
        lines.set(p, at);
        ws();
        if (text[i] !== ":") return false;
        i++;
        if (!value(p, depth + 1)) return false;
        ws();
        if (text[i] === ",") { i++; continue; }
        if (text[i] === "}") { i++; return true; }
        return false;
      }
    }
    if (c === "[") {
      i++; ws();
      if (text[i] === "]") { i++; return true; }
      for (let k = 0; ; k++) {
        ws();
        const p = `${path}[${k}]`;
        lines.set(p, line);
        if (!value(p, depth + 1)) return false;
        ws();
        if (text[i] === ",") { i++; continue; }
        if (text[i] === "]") { i++; return true; }
        return false;
      }
    }
    if (c === '"') { str(); return true; }
    const start = i;
    while (i < n && !",}]\n \t\r".includes(text[i])) i++;
    return i > start;
  };
  value("", 0);
  return lines;
}

// The line a violation's field path points at: the field itself, else its
// closest parent that is in the text (a missing field is reported at the
// object that lacks it).
function lineOf(lines, field) {
  let p = field || "";
  for (;;) {
    if (lines.has(p)) return lines.get(p);
    const cut = Math.max(p.lastIndexOf("."), p.lastIndexOf("["));
    if (cut <= 0) return lines.get(p.slice(0, Math.max(cut, 0))) ?? 0;
    p = p.slice(0, cut);
  }
}

function submitView(main) {
  mount(main, "tpl-submit");
  const editor = $("#spec-editor"), gutter = $("#gutter"), notes = $("#annotations");
  const LINE = 18, PAD = 8;
  let marks = []; // [{ line, field, message }]

  const paint = () => {
    const count = editor.value.split("\n").length;
    const bad = new Set(marks.map((m) => m.line));
    gutter.replaceChildren(...Array.from({ length: count }, (_, i) => el("div", { class: bad.has(i) ? "bad" : null, text: String(i + 1) })));
    gutter.scrollTop = editor.scrollTop;
    const used = new Map();
    notes.replaceChildren(...marks.map((m) => {
      const k = used.get(m.line) || 0;
      used.set(m.line, k + 1);
      const top = PAD + m.line * LINE - editor.scrollTop + k * 17;
      return el("div", { class: "field-error", "data-field": m.field, "data-line": String(m.line + 1), style: `top:${top}px` },
        m.field ? el("b", { text: m.field + ": " }) : null, m.message);
    }));
  };
  const setMarks = (list) => {
    marks = list;
    // Bring the first field the API named into view.
    if (list.length) {
      const first = Math.min(...list.map((m) => m.line)) * LINE;
      if (first < editor.scrollTop || first > editor.scrollTop + editor.clientHeight - 3 * LINE) editor.scrollTop = Math.max(0, first - 4 * LINE);
    }
    paint();
    $("#submit-errors").replaceChildren(...list.map((m) => el("li", { "data-field": m.field }, m.field ? el("code", { text: m.field }) : "", m.field ? " — " : "", `line ${m.line + 1}: ${m.message}`)));
  };
  const load = (name) => {
    editor.value = JSON.stringify(TEMPLATES[name], null, 2) + "\n";
    sessionStorage.setItem("trainyard-draft", editor.value);
    setMarks([]);
    $("#submit-status").textContent = `template: ${name}`;
  };
  for (const b of main.querySelectorAll("[data-template]")) b.addEventListener("click", () => load(b.dataset.template));
  editor.addEventListener("scroll", paint);
  editor.addEventListener("input", () => { sessionStorage.setItem("trainyard-draft", editor.value); paint(); });
  editor.addEventListener("keydown", (e) => {
    if (e.key === "Tab") { e.preventDefault(); editor.setRangeText("  ", editor.selectionStart, editor.selectionEnd, "end"); }
    if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) { e.preventDefault(); submit(); }
  });
  const draft = sessionStorage.getItem("trainyard-draft");
  if (draft) { editor.value = draft; paint(); } else load("allreduce");

  const submit = async () => {
    const button = $("#submit-button"), status = $("#submit-status");
    button.disabled = true;
    status.textContent = "submitting…";
    try {
      const job = await api("/v1/jobs", { method: "POST", headers: { "Content-Type": "application/json" }, body: editor.value });
      sessionStorage.removeItem("trainyard-draft");
      location.hash = "#/jobs/" + job.id;
    } catch (e) {
      if (!(e instanceof ApiError)) { status.textContent = ""; showError(e); return; }
      const p = e.problem || {};
      status.textContent = `${e.status} ${p.title || ""}: ${p.detail || ""}`;
      const lines = fieldLines(editor.value);
      let list = (p.errors || []).map((v) => ({ field: v.field, message: v.message, line: lineOf(lines, v.field) }));
      if (!list.length) {
        // Malformed JSON: serde says where ("… at line 5 column 3").
        const m = /line (\d+)/.exec(p.detail || "");
        list = [{ field: "", message: p.detail || e.message, line: m ? Number(m[1]) - 1 : 0 }];
      }
      setMarks(list);
    } finally {
      button.disabled = false;
    }
  };
  $("#submit-button").addEventListener("click", submit);
  return { onEvent() {}, dispose() {} };
}

// ---------- start ----------

$("#token-button").addEventListener("click", async () => { if (await askToken("Enter the API token (empty for none).")) route(); });
window.addEventListener("hashchange", route);
setLive(false);
route();
streamEvents();
