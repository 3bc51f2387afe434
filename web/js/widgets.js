// What several views share about jobs: the states and which of them are
// final, the series palette (its size also caps how many runs are compared),
// the state badge, and the progress bar with the steps a spec will run.

import { el } from "./dom.js";
import { showError } from "./api.js";

export const STATES = ["queued", "inspecting", "scheduling", "running", "recovering", "succeeded", "failed", "cancelled"];

export const TERMINAL = new Set(["succeeded", "failed", "cancelled"]);

export const PALETTE = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1", "#e15759", "#76b7b2", "#edc948", "#9c755f", "#ff9da7", "#bab0ac"];

export function stateBadge(state) { return el("span", { class: "state " + state, text: state }); }

// Steps the job will run when the spec says (steps, or epochs over a
// generated dataset); null when only the executor knows (epochs over a file).
export function expectedSteps(spec) {
  if (spec.steps) return spec.steps;
  const samples = spec.dataset && spec.dataset.samples;
  if (!spec.epochs || !samples) return null;
  const evalFraction = spec.eval_fraction ?? 0.1;
  const train = samples - Math.round(samples * evalFraction);
  const workers = Math.max(1, (spec.workers && spec.workers.max) || 1);
  return spec.epochs * Math.max(1, Math.ceil(Math.ceil(train / workers) / spec.batch_size));
}

export function progressBar(step, total, state, big) {
  const bar = el("div", { class: "progress" + (big ? " big" : "") });
  const fill = el("div", { class: "fill" });
  bar.append(fill);
  setProgress(bar, step, total, state);
  return bar;
}

export function setProgress(bar, step, total, state) {
  const fill = bar.firstChild;
  let frac = null;
  if (state === "succeeded") frac = 1;
  else if (total) frac = Math.min(1, step / total);
  bar.classList.toggle("unknown", frac === null && !TERMINAL.has(state) && step > 0);
  fill.style.width = frac === null ? (TERMINAL.has(state) ? "0" : "") : (frac * 100).toFixed(1) + "%";
  bar.dataset.step = step;
  bar.title = total ? `${step} / ${total} steps` : `${step} steps`;
}

// A button that acts only on a second click within 4 s (the first turns it
// into "Really cancel?"); `act` runs on the second with the button
// disabled, and the button comes back if it throws. Returns a disposer
// that clears the pending revert (a view's dispose calls it).
export function confirmingButton(button, label, act) {
  let timer = null;
  button.addEventListener("click", async () => {
    if (button.dataset.confirm !== "1") {
      button.dataset.confirm = "1";
      button.textContent = "Really cancel?";
      timer = setTimeout(() => { button.dataset.confirm = ""; button.textContent = label; }, 4000);
      return;
    }
    clearTimeout(timer);
    button.disabled = true;
    try { await act(); }
    catch (e) { showError(e); button.disabled = false; }
  });
  return () => clearTimeout(timer);
}
