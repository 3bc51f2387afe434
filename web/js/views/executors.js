// The executors (#/executors): state, devices, sandbox, roles, heartbeat
// freshness ticking between reads, and the provisioner's settings and latest
// decisions.

import { $, el, mount } from "../dom.js";
import { bytes, short } from "../format.js";
import { stateBadge } from "../widgets.js";
import { api, debounced } from "../api.js";

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

export function executorsView(main) {
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
