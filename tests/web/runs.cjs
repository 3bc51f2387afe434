// Browser test of comparing runs and of the sweep pages, driven by
// tests/e2e/web.rs: headless Debian Chromium through playwright-core,
// against a real server with real executors. Fails (non-zero exit) on the
// first broken expectation.
//
// Comparing: two digits jobs that differ in their learning rate train to
// the end; the user ticks both in the jobs list and opens the comparison,
// which must show both curves (two legend entries), the one differing spec
// field with both values, and both results; the view's address, opened in
// a fresh page, shows the same.
//
// Sweeps: see sweepPages below.
//
// Environment: TY_BASE (the API's URL), TY_CHROMIUM (the browser),
// TY_DIGITS (file:// URL of data/digits.npz), TY_EXAMPLES (examples/),
// TY_SHOTS (folder for screenshots), TY_DOCS (optional: also write the
// guides' pictures, compare.png and sweep.png, there).
"use strict";

const { chromium } = require("playwright-core");
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");

const BASE = process.env.TY_BASE;
const SHOTS = process.env.TY_SHOTS;
const T0 = Date.now();
const MINUTE = 60_000;

function log(msg) { console.log(`[${((Date.now() - T0) / 1000).toFixed(1)} s] ${msg}`); }

function example(name, patch) {
  const text = fs.readFileSync(path.join(process.env.TY_EXAMPLES, name), "utf8").replace("@DIGITS@", process.env.TY_DIGITS);
  return Object.assign(JSON.parse(text), patch);
}

async function call(method, route, body) {
  const r = await fetch(BASE + route, { method, headers: { "Content-Type": "application/json" }, body: body === undefined ? undefined : JSON.stringify(body) });
  const text = await r.text();
  if (!r.ok) throw new Error(`${method} ${route}: ${r.status} ${text}`);
  return JSON.parse(text);
}

// Polls the API (not the page) until `done(value)`; the page's own updates
// are what the assertions then wait for.
async function until(what, read, done, limit) {
  const end = Date.now() + limit;
  for (;;) {
    const v = await read();
    if (done(v)) return v;
    if (Date.now() > end) throw new Error(`${what}: still ${JSON.stringify(v).slice(0, 2000)}`);
    await new Promise((res) => setTimeout(res, 500));
  }
}

async function shot(page, name) {
  fs.mkdirSync(SHOTS, { recursive: true });
  const file = path.join(SHOTS, name + ".png");
  await page.screenshot({ path: file, fullPage: true });
  log(`screenshot ${file}`);
}

const texts = (page, sel) => page.$$eval(sel, (els) => els.map((e) => e.textContent.trim()));

async function compareRuns(page) {
  // Two runs of one spec but for the learning rate.
  const a = await call("POST", "/v1/jobs", example("digits-mlp.json", { name: "cmp-lr-small", steps: 300 }));
  const bSpec = example("digits-mlp.json", { name: "cmp-lr-large", steps: 300 });
  bSpec.optimizer.lr = 0.03;
  const b = await call("POST", "/v1/jobs", bSpec);
  log(`jobs ${a.id} (lr 0.003) and ${b.id} (lr 0.03) submitted`);
  for (const j of [a, b]) {
    const done = await until(`job ${j.id} ends`, () => call("GET", `/v1/jobs/${j.id}`), (x) => ["succeeded", "failed", "cancelled"].includes(x.state), 8 * MINUTE);
    assert.equal(done.state, "succeeded", `${j.name}: ${done.state_reason}`);
  }

  // Tick both in the jobs list and open the comparison.
  await page.goto(BASE + "/#/jobs");
  await page.waitForSelector(`#jobs tr[data-job="${b.id}"][data-state=succeeded]`);
  assert.equal(await page.isDisabled("#compare-button"), true, "nothing to compare yet");
  await page.check(`#jobs input.pick[data-job="${a.id}"]`);
  assert.equal(await page.isDisabled("#compare-button"), true, "one job is no comparison");
  await page.check(`#jobs input.pick[data-job="${b.id}"]`);
  assert.equal(await page.textContent("#compare-button"), "Compare 2 jobs");
  await page.click("#compare-button");
  await page.waitForFunction(() => document.body.dataset.view === "compare");
  const hash = new URL(page.url()).hash;
  assert.equal(hash, `#/compare/${a.id},${b.id}`, "the comparison has its own address");

  const check = async (page) => {
    await page.waitForFunction(() => document.querySelectorAll("#compare-legend li[data-job]").length === 2 && document.querySelector("#spec-diff-table"));
    // Two legend entries, the jobs' names, in the order they were ticked.
    assert.deepEqual(await page.$$eval("#compare-legend li[data-job] a:first-of-type", (as) => as.map((x) => x.textContent)), ["cmp-lr-small", "cmp-lr-large"]);
    // Both curves on each chart, in the legend's colours.
    await page.waitForFunction(() => document.querySelectorAll("#cmp-loss polyline[data-job]").length === 2 && document.querySelectorAll("#cmp-acc polyline[data-job]").length === 2);
    const colours = await page.$$eval("#cmp-loss polyline[data-job]", (ps) => ps.map((p) => p.getAttribute("stroke")));
    const swatches = await page.$$eval("#compare-legend li .swatch", (is) => is.map((i) => getComputedStyle(i).backgroundColor));
    assert.equal(new Set(colours).size, 2, "one colour per job");
    assert.equal(swatches.length, 2);
    // The one spec field that differs, with both values; nothing else but
    // the learning rate (names are the columns' headers).
    const rows = await page.$$eval("#spec-diff-table tbody tr", (trs) => trs.map((tr) => tr.dataset.field));
    assert.deepEqual(rows, ["optimizer.lr"], `differing fields: ${rows}`);
    assert.deepEqual(await texts(page, '#spec-diff-table tr[data-field="optimizer.lr"] td'), ["optimizer.lr", "0.003", "0.03"]);
    assert.deepEqual(await texts(page, "#spec-diff-table thead th"), ["field", "cmp-lr-small", "cmp-lr-large"]);
    // Results side by side: both ran their 300 steps to `succeeded`, with a
    // final loss and held-out accuracy each.
    assert.deepEqual(await texts(page, "#final-metrics tr[data-metric=state] td"), ["succeeded", "succeeded"]);
    assert.deepEqual(await texts(page, "#final-metrics tr[data-metric=steps] td"), ["300", "300"]);
    for (const row of ["final_loss", "last_accuracy", "best_accuracy", "last_eval_loss"]) {
      const cells = await texts(page, `#final-metrics tr[data-metric=${row}] td`);
      assert.equal(cells.length, 2);
      assert.ok(cells.every((c) => /^\d+\.\d+( @ \d+)?$/.test(c)), `${row}: ${cells}`);
    }
    const acc = await texts(page, "#final-metrics tr[data-metric=last_accuracy] td");
    assert.ok(acc.every((c) => c.endsWith("@ 300")), `the last evaluation is at the last step: ${acc}`);
    // The API's own figures: the last held-out accuracy the page shows is
    // the one the metrics endpoint has at step 300.
    const series = await call("GET", `/v1/jobs/${a.id}/metrics?max_points=1000`);
    const last = series.points.filter((p) => p.eval_accuracy !== null).pop();
    assert.equal(acc[0], `${last.eval_accuracy.toFixed(4)} @ ${last.step}`);
    // Exactly one cell of a row that has a better and a worse is marked best.
    assert.equal(await page.$$eval("#final-metrics tr[data-metric=final_loss] td.best", (x) => x.length), 1);
    assert.match(await page.textContent("#final-metrics tr[data-metric=duration] td"), /\d+ (s|min)/);
  };
  await check(page);
  await shot(page, "compare");
  if (process.env.TY_DOCS) {
    fs.mkdirSync(process.env.TY_DOCS, { recursive: true });
    await page.screenshot({ path: path.join(process.env.TY_DOCS, "compare.png"), fullPage: true });
  }
  log("comparison: two curves, optimizer.lr 0.003 vs 0.03, both results");

  // The address works on its own: a fresh page opened at it shows the same.
  const fresh = await page.context().newPage();
  await fresh.goto(BASE + "/" + hash);
  await fresh.waitForFunction(() => document.body.dataset.view === "compare");
  await check(fresh);
  await fresh.close();

  // Leaving one job out: the other remains, and nothing is left to differ.
  await page.click(`#compare-legend li[data-job="${b.id}"] a.remove`);
  await page.waitForFunction(() => document.querySelectorAll("#compare-legend li[data-job]").length === 1);
  assert.equal(new URL(page.url()).hash, `#/compare/${a.id}`);
  await page.waitForSelector("#spec-diff p.muted");
  // An id that names no job is said so, beside the others.
  await page.goto(`${BASE}/#/compare/${a.id},00000000-0000-0000-0000-000000000000`);
  await page.waitForFunction(() => document.querySelector('#compare-legend li[data-state=missing]'));
  assert.match(await page.textContent("#compare-legend li[data-state=missing]"), /no such job/);
  return { a, b };
}

// The sweep pages: a sweep of four learning rates (examples/digits-sweep.json,
// ASHA with η = 2) runs to its end while the page watches; the page then
// shows every trial, the stopped ones with their reason, the metric at each
// rung, the best trial highlighted (the API's best), the chart with a line
// per trial and the rungs dashed across it. A second sweep, whose trials
// no executor can take, is cancelled from its page.
async function sweepPages(page) {
  const text = fs.readFileSync(path.join(process.env.TY_EXAMPLES, "digits-sweep.json"), "utf8").replace("@DIGITS@", process.env.TY_DIGITS);
  const spec = JSON.parse(text);
  spec.name = "ui-sweep";
  const created = await call("POST", "/v1/sweeps", spec);
  log(`sweep ${created.id}: rungs ${created.rungs}, ${created.trials.length} trials`);
  assert.equal(created.trials.length, 4);

  await page.goto(BASE + "/#/sweeps");
  await page.waitForSelector(`#sweeps tr[data-sweep="${created.id}"]`);
  await page.click(`#sweeps tr[data-sweep="${created.id}"] td a`);
  await page.waitForFunction(() => document.body.dataset.view === "sweep");
  assert.equal(new URL(page.url()).hash, `#/sweeps/${created.id}`);
  await page.waitForFunction(() => document.querySelectorAll("#trials tr[data-trial]").length === 4);
  assert.equal(await page.textContent("#sweep-name"), "ui-sweep");
  // The rungs are columns of the trials' table and lines on the chart.
  assert.deepEqual(await texts(page, "#trials thead th.num"), [...created.rungs.map((r) => `@ ${r}`), "eval_accuracy", "step", "workers"]);
  assert.deepEqual(await texts(page, '#trials thead th code'), ["optimizer.lr"]);

  // The page follows the sweep to its end by itself.
  await page.waitForFunction(() => document.querySelector("#sweep-state")?.dataset.state === "succeeded", null, { timeout: 12 * MINUTE });
  const sweep = await call("GET", `/v1/sweeps/${created.id}`);
  log(`sweep ended: ${sweep.trials.map((t) => `t${t.index} ${t.state} ${t.rung_metrics.length} rungs`).join(", ")}`);
  assert.ok(sweep.best, "the API names a best trial");
  // Every trial's row says what the API says.
  await page.waitForFunction((n) => [...document.querySelectorAll("#trials tr[data-trial]")].every((tr) => !["running", "pending"].includes(tr.dataset.state)) && document.querySelectorAll("#sweep-chart polyline[data-job]").length === n, sweep.trials.length);
  const rows = await page.$$eval("#trials tr[data-trial]", (trs) => trs.map((tr) => ({ index: Number(tr.dataset.trial), state: tr.dataset.state, rungs: Number(tr.dataset.rungs), best: tr.classList.contains("best"), reason: tr.lastElementChild.textContent })));
  assert.deepEqual(rows.map((r) => [r.index, r.state, r.rungs]), sweep.trials.map((t) => [t.index, t.state, t.rung_metrics.length]));
  const stopped = rows.filter((r) => r.state === "stopped");
  assert.ok(stopped.length >= 1, `at least one trial was stopped early: ${JSON.stringify(rows)}`);
  assert.ok(stopped.every((r) => r.reason.length > 0), "a stopped trial says why");
  // The metric at each rung reached, as the API has it.
  for (const t of sweep.trials) {
    const cells = await texts(page, `#trials tr[data-trial="${t.index}"] td[data-rung]`);
    assert.deepEqual(cells.slice(0, t.rung_metrics.length), t.rung_metrics.map((m) => (m * 100).toFixed(2) + "%"), `trial ${t.index}`);
  }
  // The best trial, highlighted: the API's, and it shows its value.
  assert.deepEqual(rows.filter((r) => r.best).map((r) => r.index), [sweep.best.index]);
  assert.equal(await page.getAttribute("#sweep-best", "data-trial"), String(sweep.best.index));
  assert.match(await page.textContent("#sweep-best"), new RegExp(`trial ${sweep.best.index} · eval_accuracy ${(sweep.best.metric * 100).toFixed(2)}%`));
  assert.equal(await page.textContent(`#trials tr.best td[data-metric]`), (sweep.best.metric * 100).toFixed(2) + "%");
  // The chart: a line per trial, the best one drawn thicker, a dashed line per rung.
  assert.equal(await page.$$eval("#sweep-chart line.rung", (ls) => ls.length), sweep.rungs.length);
  assert.equal(await page.getAttribute(`#sweep-chart polyline[data-job="${sweep.best.job_id}"]`, "stroke-width"), "3.5");
  assert.equal(await page.isVisible("#sweep-cancel"), false, "an ended sweep has nothing to cancel");
  await shot(page, "sweep");
  if (process.env.TY_DOCS) {
    fs.mkdirSync(process.env.TY_DOCS, { recursive: true });
    await page.screenshot({ path: path.join(process.env.TY_DOCS, "sweep.png"), fullPage: true });
  }
  log(`sweep page: ${stopped.length} stopped, best trial ${sweep.best.index} at ${sweep.best.metric}`);

  // A trial's job page links back to its sweep.
  await page.click(`#trials tr[data-trial="${sweep.best.index}"] td a`);
  await page.waitForSelector("#job-sweep");
  assert.equal(await page.textContent("#job-sweep"), `${sweep.id.slice(-8)}, trial ${sweep.best.index}`);
  await page.click("#job-sweep");
  await page.waitForFunction(() => document.body.dataset.view === "sweep");
  // Comparing the trials: their curves, and the one field that differs.
  await page.waitForSelector("#sweep-compare:not([hidden])");
  await page.click("#sweep-compare");
  await page.waitForFunction(() => document.body.dataset.view === "compare" && document.querySelector("#spec-diff-table"));
  await page.waitForFunction((n) => document.querySelectorAll("#compare-legend li[data-job]").length === n, sweep.trials.length);
  assert.deepEqual(await page.$$eval("#spec-diff-table tbody tr", (trs) => trs.map((tr) => tr.dataset.field)), ["optimizer.lr"]);
  await shot(page, "sweep-compare");

  // Cancelling from the page: trials no executor can take wait in the
  // queue until the sweep is cancelled with them.
  const held = JSON.parse(text);
  held.name = "ui-sweep-held";
  held.base.resources = { memory_mb: 1 << 20 };
  const h = await call("POST", "/v1/sweeps", held);
  await page.goto(`${BASE}/#/sweeps/${h.id}`);
  await page.waitForFunction(() => document.querySelector("#sweep-state")?.dataset.state === "running");
  await page.click("#sweep-cancel");
  assert.equal(await page.textContent("#sweep-cancel"), "Really cancel?");
  await page.click("#sweep-cancel");
  await page.waitForFunction(() => document.querySelector("#sweep-state")?.dataset.state === "cancelled");
  const after = await call("GET", `/v1/sweeps/${h.id}`);
  assert.equal(after.state, "cancelled");
  for (const t of after.trials.filter((t) => t.job_id)) {
    const j = await until(`trial ${t.index}'s job is cancelled`, () => call("GET", `/v1/jobs/${t.job_id}`), (x) => x.state === "cancelled", MINUTE);
    assert.equal(j.state, "cancelled");
  }
  await page.click("[data-nav=sweeps]");
  await page.waitForSelector(`#sweeps tr[data-sweep="${h.id}"][data-state=cancelled]`);
  assert.deepEqual(await page.$$eval("#sweeps tr[data-sweep] td:first-child a", (as) => as.map((a) => a.textContent)), ["ui-sweep-held", "ui-sweep"], "newest first");
  await shot(page, "sweeps");
  log("sweep cancelled from its page");
}

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
    page.on("console", (m) => { if (m.type() === "error" && !m.text().startsWith("Failed to load resource")) pageErrors.push("console: " + m.text()); });

    await compareRuns(page);
    await sweepPages(page);

    assert.deepEqual(pageErrors, [], "no script errors on the page");
    log("all browser checks passed");
  } catch (e) {
    for (const p of browser.contexts().flatMap((c) => c.pages())) {
      await shot(p, "runs-failure").catch(() => {});
      const shown = await p.evaluate(() => ({ url: location.href, view: document.body.dataset.view, main: document.querySelector("#view")?.innerText.slice(0, 3000), error: document.querySelector("#error")?.innerText })).catch((x) => String(x));
      console.error("page at failure:", JSON.stringify(shown, null, 1));
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
