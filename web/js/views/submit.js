// The spec editor (#/submit): a JSON textarea with line numbers, a template
// per strategy, and the API's field errors placed at the lines of the fields
// they name (the API validates; the page only points).

import { $, el, mount } from "../dom.js";
import { api, ApiError, showError } from "../api.js";

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

// The browser test (tests/web/ui.cjs) calls these two in the page to check
// how field paths map to editor lines, so the page offers them by name.
Object.assign(window, { fieldLines, lineOf });

export function submitView(main) {
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
