// The REST client of every view: `api` sends the tab's bearer token and, on
// a 401, opens the token prompt and retries; a failure comes back as
// ApiError carrying the API's problem document (field errors included).
// `showError` and `debounced` are how views refetch and report failures.

import { $ } from "./dom.js";

const TOKEN_KEY = "trainyard-token";

export function token() { return sessionStorage.getItem(TOKEN_KEY) || ""; }

export function authHeaders(extra = {}) {
  const h = Object.assign({}, extra);
  const t = token();
  if (t) h.Authorization = "Bearer " + t;
  return h;
}

let tokenPrompt = null;

export function askToken(why) {
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

export class ApiError extends Error {
  constructor(status, problem) {
    super((problem && (problem.detail || problem.title)) || "HTTP " + status);
    this.status = status;
    this.problem = problem;
  }
}

export async function api(path, opts = {}) {
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

export function showError(e) {
  const box = $("#error");
  if (!e) { box.hidden = true; return; }
  box.textContent = e.message || String(e);
  box.hidden = false;
}

// Runs fn at most once per `ms`, the last call winning; returns the trigger.
export function debounced(fn, ms = 150) {
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
