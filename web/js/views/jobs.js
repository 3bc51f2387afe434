// The jobs list (#/jobs): newest first, filtered by state, with progress and
// the latest loss; ticked rows are kept for #/compare. Curves are refetched
// only for the jobs an event or a state change says have moved.

import { $, el, mount } from "../dom.js";
import { age, fmt, short } from "../format.js";
import { expectedSteps, PALETTE, progressBar, stateBadge, STATES } from "../widgets.js";
import { api, debounced, showError } from "../api.js";

const PICKED_KEY = "trainyard-compare";

export function jobsView(main) {
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
