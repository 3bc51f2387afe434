// Browser test of the web UI, driven by tests/e2e/web.rs: headless Debian
// Chromium through playwright-core, against a real server with real
// executors. Fails (non-zero exit) on the first broken expectation.
//
// Environment: TY_BASE (the API's URL), TY_CHROMIUM (the browser),
// TY_DIGITS (file:// URL of data/digits.npz), TY_EXAMPLES (examples/),
// TY_SHOTS (folder for screenshots), TY_DOCS (optional: also write the two
// the web UI guide's screenshots there). The test asks its driver to kill executors
// with a line `@@kill-executor-of JOB` on stdout and waits for one line
// back on stdin.
"use strict";

const { chromium } = require("playwright-core");
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");
const readline = require("node:readline");

const BASE = process.env.TY_BASE;
const SHOTS = process.env.TY_SHOTS;
const DOCS = process.env.TY_DOCS || "";
const DIGITS = process.env.TY_DIGITS;
const EXAMPLES = process.env.TY_EXAMPLES;
const T0 = Date.now();
const MINUTE = 60_000;

function log(msg) { console.log(`[${((Date.now() - T0) / 1000).toFixed(1)} s] ${msg}`); }

// ---- the line protocol with the Rust driver ----
const replies = [];
let waiting = null;
readline.createInterface({ input: process.stdin }).on("line", (l) => {
  if (waiting) { const w = waiting; waiting = null; w(l); } else replies.push(l);
});
function ask(command) {
  process.stdout.write(`@@${command}\n`);
  return new Promise((resolve) => { if (replies.length) resolve(replies.shift()); else waiting = resolve; });
}

function example(name, patch) {
  const text = fs.readFileSync(path.join(EXAMPLES, name), "utf8").replace("@DIGITS@", DIGITS);
  return Object.assign(JSON.parse(text), patch);
}

async function shot(page, name, docsName) {
  fs.mkdirSync(SHOTS, { recursive: true });
  const file = path.join(SHOTS, name + ".png");
  await page.screenshot({ path: file, fullPage: true });
  log(`screenshot ${file}`);
  if (DOCS && docsName) {
    // The web UI guide's picture: from the header down to the timeline.
    fs.mkdirSync(DOCS, { recursive: true });
    const bottom = await page.evaluate(() => document.querySelector("#timeline").closest(".card").getBoundingClientRect().bottom + window.scrollY);
    await page.screenshot({ path: path.join(DOCS, docsName), fullPage: true, clip: { x: 0, y: 0, width: 1360, height: Math.ceil(bottom + 12) } });
  }
}

async function submitThroughForm(page, spec) {
  await page.click("[data-nav=submit]");
  await page.waitForSelector("#spec-editor");
  await page.fill("#spec-editor", JSON.stringify(spec, null, 2));
  await page.click("#submit-button");
  await page.waitForFunction(() => document.body.dataset.view === "job" && document.querySelector("#job-state")?.dataset.state);
  const id = decodeURIComponent(new URL(page.url()).hash.split("/")[2]);
  assert.match(id, /^[0-9a-f-]{36}$/, "the page shows the new job");
  return id;
}

const stateOf = (page) => page.evaluate(() => document.querySelector("#job-state")?.dataset.state);
const transitions = (page) => page.evaluate(() => [...document.querySelectorAll("#timeline li[data-kind=transition]")].map((li) => li.dataset.to));

async function main() {
  const browser = await chromium.launch({
    executablePath: process.env.TY_CHROMIUM,
    args: ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"],
  });
  const pageErrors = [];
  try {
    const context = await browser.newContext({ viewport: { width: 1360, height: 900 } });
    context.setDefaultTimeout(30_000);
    const page = await context.newPage();
    page.on("pageerror", (e) => pageErrors.push(String(e)));
    // Chromium logs every 4xx answer as a console error; the invalid spec's
    // 422 is expected, so only script errors count.
    page.on("console", (m) => { if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) pageErrors.push("console: " + m.text()); });

    // ---- the jobs page subscribes to live updates ----
    await page.goto(BASE + "/");
    await page.waitForFunction(() => document.body.dataset.live === "1");
    await page.evaluate(() => { window.__sameDocument = "never reloaded"; });
    log("page loaded; event stream connected");

    // ---- executors ----
    await page.click("[data-nav=executors]");
    await page.waitForFunction(() => document.querySelectorAll("#executors tr[data-state=live]").length >= 4);
    const hb = await page.textContent("#executors tr[data-state=live] td.heartbeat");
    assert.match(hb, /s ago/, "heartbeat freshness is shown");
    // Each executor says how it confines users' code.
    const sandbox = await page.textContent("#executors tr[data-state=live] td.sandbox");
    assert.equal(sandbox, "confined", "the executor's sandbox is shown");
    assert.match(await page.getAttribute("#executors tr[data-state=live] td.sandbox", "title"), /landlock ABI \d+/, "its layers are in the tooltip");
    assert.equal(await page.getAttribute("#executors tr[data-state=live] td.sandbox", "data-sandbox-scripts"), "confined", "script jobs' sandbox is shown");
    assert.match(await page.getAttribute("#executors tr[data-state=live] td.sandbox", "title"), /network namespace each/, "the network layer is in the tooltip");
    await page.waitForFunction(() => (document.querySelector("#provisioner-settings")?.textContent || "").length > 0);
    assert.match(await page.textContent("#provisioner-settings"), /started by hand/, "the provisioner is shown");
    await shot(page, "executors");

    // ---- an invalid spec: the field error is shown beside the field ----
    await page.click("[data-nav=submit]");
    await page.click("[data-template=parameter_server]");
    const tpl = JSON.parse(await page.inputValue("#spec-editor"));
    assert.equal(tpl.strategy, "parameter_server");
    await page.click("[data-template=allreduce]");
    const bad = JSON.parse(await page.inputValue("#spec-editor"));
    assert.equal(bad.strategy, "allreduce");
    bad.optimizer.lr = 0;
    bad.batch_size = 0;
    const badText = JSON.stringify(bad, null, 2);
    await page.fill("#spec-editor", badText);
    await page.click("#submit-button");
    const lrNote = page.locator('.field-error[data-field="optimizer.lr"]');
    await lrNote.waitFor();
    assert.match(await lrNote.textContent(), /optimizer\.lr: must be greater than 0/);
    const lrLine = badText.split("\n").findIndex((l) => l.includes('"lr"')) + 1;
    assert.equal(await lrNote.getAttribute("data-line"), String(lrLine), "the note names the field's line");
    const box = await lrNote.boundingBox();
    const editor = await page.locator("#spec-editor").boundingBox();
    const scrolled = await page.evaluate(() => document.querySelector("#spec-editor").scrollTop);
    const lineTop = editor.y + 8 + (lrLine - 1) * 18 - scrolled;
    assert.ok(lineTop >= editor.y && lineTop < editor.y + editor.height, "the field's line is in view");
    assert.ok(Math.abs(box.y - lineTop) < 18, `note at y=${box.y}, field line at y=${lineTop}`);
    assert.ok(box.x > editor.x + editor.width - 4, "the note is beside the editor");
    await page.locator('.field-error[data-field="batch_size"]').waitFor();
    assert.equal(await page.evaluate(() => document.body.dataset.view), "submit", "nothing was submitted");
    await shot(page, "submit-invalid");
    log("invalid spec: field errors beside optimizer.lr and batch_size");

    // Field paths map to editor lines; a missing field points at its parent.
    const lines = await page.evaluate(() => {
      const l = fieldLines('{\n  "a": {\n    "b": [1,\n      2]\n  },\n  "c": "x"\n}');
      return [lineOf(l, "a.b[1]"), lineOf(l, "a.missing"), lineOf(l, "c"), lineOf(l, "nope"), lineOf(l, "")];
    });
    assert.deepEqual(lines, [3, 1, 5, 0, 0]);
    // Malformed JSON: the parser's complaint at the line it names.
    await page.fill("#spec-editor", '{\n  "name": "x",\n  "steps": \n}');
    await page.click("#submit-button");
    const syntax = page.locator('.field-error[data-field=""]');
    await syntax.waitFor();
    assert.equal(await syntax.getAttribute("data-line"), "4");
    assert.match(await page.textContent("#submit-status"), /^400 Malformed JSON/);

    // ---- a job submitted through the form trains to `succeeded`, live ----
    // Long enough (a second or more) that the page sees the job running
    // and its curve grow before it ends.
    const digits = example("digits-mlp.json", { name: "ui-digits", steps: 3000, checkpoint: { every_steps: 1000, keep: 2 } });
    const id = await submitThroughForm(page, digits);
    await page.evaluate(() => {
      window.__states = [];
      setInterval(() => {
        const s = document.querySelector("#job-state")?.dataset.state;
        if (s && window.__states[window.__states.length - 1] !== s) window.__states.push(s);
      }, 25);
    });
    // Generous: the test suite runs other training tests beside this one on
    // a 2-core machine, and then 3000 steps take minutes.
    await page.waitForFunction(() => document.querySelector("#job-state")?.dataset.state === "succeeded", null, { timeout: 8 * MINUTE });
    await page.waitForFunction(() => window.__states[window.__states.length - 1] === "succeeded");
    const seen = await page.evaluate(() => window.__states);
    log(`job ${id}: states seen on the page: ${seen.join(" → ")}`);
    assert.equal(seen[seen.length - 1], "succeeded");
    assert.ok(seen.length >= 2, "the page saw the job before it ended");
    await page.waitForFunction(() => [...document.querySelectorAll("#timeline li[data-kind=transition]")].map((li) => li.dataset.to).join(",") === "scheduling,running,succeeded");
    assert.deepEqual(await transitions(page), ["scheduling", "running", "succeeded"]);
    await page.waitForFunction(() => Number(document.querySelector("#loss-chart")?.dataset.points) >= 10 && document.querySelector("#loss-chart polyline"));
    const pts = await page.getAttribute("#loss-chart polyline[data-series='training loss']", "points");
    assert.ok(pts.trim().split(/\s+/).length >= 10, "the loss curve has drawn points");
    await page.waitForFunction(() => document.querySelector("#acc-chart polyline"));
    await page.waitForSelector("#weights-link");
    assert.match(await page.textContent("#weights-link"), /^file:\/\/.*model\.safetensors$/);
    // The committed checkpoints are listed (at least the one at the end),
    // and the link downloads the final weights through the API.
    await page.waitForSelector("#checkpoint-table tr[data-step]");
    const model = await page.evaluate(async (href) => {
      const r = await fetch(href);
      return { status: r.status, bytes: (await r.arrayBuffer()).byteLength };
    }, await page.getAttribute("#weights-link", "href"));
    assert.equal(model.status, 200);
    assert.ok(model.bytes > 1000, `the model download has ${model.bytes} bytes`);
    // The model's tensors are listed with their kind and dtype: the MLP's
    // are all trainable float32 parameters.
    await page.waitForSelector("#tensor-table tr[data-tensor]");
    const tensors = await page.evaluate(() => [...document.querySelectorAll("#tensor-table tr[data-tensor]")].map((tr) => `${tr.dataset.kind}/${tr.dataset.dtype}`));
    assert.ok(tensors.length >= 2 && tensors.every((t) => t === "parameter/float32"), tensors.join(", "));
    // The last steps' metrics may land just after the outcome; the page
    // still gets them (the stream announces late telemetry).
    await page.waitForFunction(() => /step 3000 of 3000/.test(document.querySelector("#job-progress-text")?.textContent));
    assert.equal(await page.evaluate(() => document.querySelector("#job-progress-fill").style.width), "100%");
    await page.waitForFunction(() => document.querySelector("#logs")?.textContent.includes("worker0 g1 "));
    assert.equal(await page.evaluate(() => window.__sameDocument), "never reloaded");
    await shot(page, "job-succeeded");

    await page.click("[data-nav=jobs]");
    await page.waitForSelector(`#jobs tr[data-job="${id}"][data-state=succeeded]`);
    await page.waitForFunction((job) => document.querySelector(`#jobs tr[data-job="${job}"] .progress .fill`)?.style.width === "100%", id);
    await shot(page, "jobs");

    // ---- an executor dies under a running job: the timeline shows the recovery ----
    const long = example("digits-mlp.json", { name: "ui-recovery", steps: 1_000_000 });
    const rid = await submitThroughForm(page, long);
    await page.waitForFunction(() => document.querySelector("#job-state")?.dataset.state === "running" && Number(document.querySelector("#loss-chart")?.dataset.points) > 0, null, { timeout: 4 * MINUTE });
    const before = await page.getAttribute("#cluster [data-role=worker]", "data-executor");
    const reply = await ask(`kill-executor-of ${rid}`);
    log(`driver: ${reply}`);
    assert.ok(reply.startsWith("killed " + before), `the driver killed ${before}: ${reply}`);
    await page.waitForFunction(() => {
      const to = [...document.querySelectorAll("#timeline li[data-kind=transition]")].map((li) => li.dataset.to);
      const r = to.indexOf("recovering");
      return r > 0 && to.slice(r + 1).includes("running");
    }, null, { timeout: 4 * MINUTE });
    const moved = await page.evaluate(() => [...document.querySelectorAll("#timeline li[data-kind=placement]")].map((li) => li.textContent));
    assert.ok(moved.length >= 2, "a second placement");
    assert.match(moved[moved.length - 1], /lost/, `the placement says why: ${moved[moved.length - 1]}`);
    await page.waitForFunction((old) => {
      const w = document.querySelector("#cluster [data-role=worker]");
      return w && w.dataset.executor !== old;
    }, before);
    const after = await page.getAttribute("#cluster [data-role=worker]", "data-executor");
    log(`recovery: worker 0 moved from ${before} to ${after}`);
    assert.ok(await page.evaluate(() => Number(document.querySelector("#cluster").dataset.generation) >= 2));
    await shot(page, "job-recovered");

    // ---- the cancel button ----
    await page.click("#cancel-button");
    await page.click("#cancel-button");
    await page.waitForFunction(() => document.querySelector("#job-state")?.dataset.state === "cancelled");
    await page.waitForFunction(() => [...document.querySelectorAll("#timeline li[data-kind=transition]")].some((li) => li.dataset.to === "cancelled"));
    log("cancelled from the page");

    // ---- a running PS job and a running ring job (the web UI guide's pictures) ----
    const ps = example("digits-ps.json", { name: "digits-ps", steps: 1_000_000 });
    await submitThroughForm(page, ps);
    await page.waitForFunction(() => document.querySelector("#job-state")?.dataset.state === "running", null, { timeout: 4 * MINUTE });
    await page.waitForFunction(() => document.querySelectorAll("#cluster svg[data-kind=parameter_server] [data-role=ps]").length === 2
      && document.querySelectorAll("#cluster svg[data-kind=parameter_server] [data-role=worker]").length === 2);
    assert.ok(await page.evaluate(() => document.querySelector("#cluster table.ranges")?.textContent.includes("fc0.weight")), "shard ranges are listed");
    await page.waitForFunction(() => document.querySelector("#logs")?.textContent.length > 20);
    // For the picture only: once the PS data plane trains, show its first steps.
    await page.waitForFunction(() => Number(document.querySelector("#loss-chart")?.dataset.points) >= 5, null, { timeout: 10_000 }).catch(() => log("the PS job has no steps to show yet"));
    await shot(page, "job-ps-running", "job-ps.png");

    const ring = example("digits-mlp.json", { name: "digits-ring", steps: 1_000_000, workers: { min: 2, max: 2 } });
    await submitThroughForm(page, ring);
    await page.waitForFunction(() => document.querySelector("#job-state")?.dataset.state === "running", null, { timeout: 4 * MINUTE });
    await page.waitForFunction(() => document.querySelectorAll("#cluster svg[data-kind=allreduce] [data-role=worker]").length === 2
      && document.querySelectorAll("#cluster .ringlink").length === 2);
    await page.waitForFunction(() => document.querySelector("#logs")?.textContent.length > 20);
    // For the picture only: a ring that trains shows its first steps.
    await page.waitForFunction(() => Number(document.querySelector("#loss-chart")?.dataset.points) >= 5, null, { timeout: 20_000 }).catch(() => log("the ring has no steps to show yet"));
    // Each rank as its heartbeat describes it: what it does, its step time.
    await page.waitForFunction(() => document.querySelectorAll("#rank-table tr[data-rank]").length === 2, null, { timeout: 30_000 });
    assert.deepEqual(await page.evaluate(() => [...document.querySelectorAll("#rank-table tr[data-rank]")].map((tr) => tr.dataset.rank)), ["0", "1"]);
    await shot(page, "job-ring-running", "job-ring.png");

    // ---- the jobs table: newest first, filtered by state ----
    await page.click("[data-nav=jobs]");
    const names = () => page.evaluate(() => [...document.querySelectorAll("#jobs tr[data-job] td.name > a:first-child")].map((a) => a.textContent));
    await page.waitForFunction(() => document.querySelectorAll("#jobs tr[data-job]").length === 4);
    assert.deepEqual(await names(), ["digits-ring", "digits-ps", "ui-recovery", "ui-digits"]);
    await page.selectOption("#state-filter", "running");
    await page.waitForFunction(() => [...document.querySelectorAll("#jobs tr[data-job]")].every((tr) => tr.dataset.state === "running") && document.querySelectorAll("#jobs tr[data-job]").length === 2);
    assert.deepEqual(await names(), ["digits-ring", "digits-ps"]);
    await shot(page, "jobs-running");
    await page.selectOption("#state-filter", "succeeded");
    await page.waitForFunction(() => document.querySelectorAll("#jobs tr[data-job]").length === 1);
    assert.deepEqual(await names(), ["ui-digits"]);
    await page.selectOption("#state-filter", "");
    await page.waitForFunction(() => document.querySelectorAll("#jobs tr[data-job]").length === 4);
    await shot(page, "jobs-all");

    await page.click("[data-nav=executors]");
    await page.waitForFunction(() => document.querySelectorAll("#executors td.roles a").length >= 6);
    // The executor killed earlier is listed as lost, its heartbeat stale.
    await page.waitForSelector(`#executors tr[data-executor="${before}"][data-state=lost]`);
    assert.match(await page.textContent(`#executors tr[data-executor="${before}"] td.heartbeat`), /\d+ s ago/);
    await shot(page, "executors-busy");

    // ---- usage: the jobs that ran, with the workers' seconds they held ----
    await page.click("[data-nav=usage]");
    await page.waitForFunction(() => document.querySelectorAll("#usage-jobs tr[data-job]").length >= 3);
    const cpuSeconds = await page.$$eval("#usage-jobs tr[data-job] td.num:nth-of-type(5)", (tds) => tds.map((t) => Number(t.textContent)));
    assert.ok(cpuSeconds.every((s) => s >= 0) && cpuSeconds.some((s) => s > 0), `CPU-worker-seconds ${cpuSeconds}`);
    assert.equal(await page.textContent("#usage-owners tr[data-owner] td b"), "admin");
    await shot(page, "usage");

    assert.equal(await page.evaluate(() => window.__sameDocument), "never reloaded");
    assert.deepEqual(pageErrors, [], "no script errors on the page");
    log("all browser checks passed");
  } catch (e) {
    // What the page showed, and what the API says, when it broke.
    for (const p of browser.contexts().flatMap((c) => c.pages())) {
      await shot(p, "failure").catch(() => {});
      const shown = await p.evaluate(() => ({ url: location.href, live: document.body.dataset.live, state: document.querySelector("#job-state")?.dataset.state, timeline: document.querySelector("#timeline")?.innerText, error: document.querySelector("#error")?.innerText })).catch((x) => String(x));
      console.error("page at failure:", JSON.stringify(shown, null, 1));
      const m = /#\/jobs\/([0-9a-f-]{36})/.exec(p.url());
      if (m) console.error("API says:", await (await fetch(`${BASE}/v1/jobs/${m[1]}`)).text().catch(String));
    }
    console.error("page errors:", pageErrors);
    throw e;
  } finally {
    await browser.close();
  }
}

const deadline = setTimeout(() => { console.error("browser test: over 20 minutes"); process.exit(1); }, 20 * MINUTE);
main().then(() => { clearTimeout(deadline); process.exit(0); }, (e) => {
  console.error(`browser test failed after ${((Date.now() - T0) / 1000).toFixed(1)} s:`, e && e.stack || e);
  process.exit(1);
});
