// Usage (#/usage): device-, CPU-worker-seconds and PS RAM per user and per
// job over a chosen window, from GET /v1/usage.

import { $, el, mount } from "../dom.js";
import { short } from "../format.js";
import { stateBadge } from "../widgets.js";
import { api, debounced } from "../api.js";

export function usageView(main) {
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
