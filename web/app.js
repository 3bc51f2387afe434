// Trainyard web UI: plain JavaScript over the REST API, as ES modules the
// browser loads from /assets/ (all embedded in the binary) with no build step.
//
// This entry maps the URL hash to a view (#/jobs, #/jobs/ID, #/compare/ID,ID,…,
// #/sweeps, #/sweeps/ID, #/executors, #/usage, #/submit), one module each
// under js/views/. A view is a function (main, …args) that fills `main` from
// its <template> in index.html and returns { onEvent(kind, data), dispose() }.
// Live updates come from GET /v1/events/stream (js/events.js): each event
// names what changed and the mounted view refetches just that. A 401 from
// any request opens the token prompt (js/api.js).

import { $ } from "./js/dom.js";
import { api, askToken, showError } from "./js/api.js";
import { setLive, streamEvents } from "./js/events.js";
import { jobsView } from "./js/views/jobs.js";
import { jobView } from "./js/views/job.js";
import { compareView } from "./js/views/compare.js";
import { sweepsView, sweepView } from "./js/views/sweeps.js";
import { executorsView } from "./js/views/executors.js";
import { usageView } from "./js/views/usage.js";
import { submitView } from "./js/views/submit.js";

let current = null; // the mounted view: { onEvent(kind, data), dispose() }

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

$("#token-button").addEventListener("click", async () => { if (await askToken("Enter the API token (empty for none).")) route(); });
window.addEventListener("hashchange", route);
setLive(false);
route();
streamEvents("/v1/events/stream", (kind, data) => { if (current) current.onEvent(kind, data); });
