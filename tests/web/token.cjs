// Browser test of the token prompt, driven by tests/e2e/web.rs: against a
// server started with --admin-token, the page asks for the token, refuses a
// wrong one, and once given the right one lists jobs and goes live.
//
// Environment: TY_BASE, TY_CHROMIUM, TY_SHOTS, TY_TOKEN (the right token).
"use strict";

const { chromium } = require("playwright-core");
const assert = require("node:assert/strict");
const fs = require("node:fs");
const path = require("node:path");

async function main() {
  const browser = await chromium.launch({ executablePath: process.env.TY_CHROMIUM, args: ["--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu"] });
  try {
    const page = await browser.newPage({ viewport: { width: 1200, height: 700 } });
    page.setDefaultTimeout(20_000);
    const errors = [];
    page.on("pageerror", (e) => errors.push(String(e)));
    await page.goto(process.env.TY_BASE + "/");
    await page.waitForSelector("#token-dialog[open]");
    assert.equal(await page.evaluate(() => document.body.dataset.live), "0", "not live without the token");
    fs.mkdirSync(process.env.TY_SHOTS, { recursive: true });
    await page.screenshot({ path: path.join(process.env.TY_SHOTS, "token-prompt.png") });

    await page.fill("#token-input", "not-the-token");
    await page.click("#token-ok");
    await page.waitForFunction(() => document.querySelector("#token-dialog").open && /refused/.test(document.querySelector("#token-why").textContent));

    await page.fill("#token-input", process.env.TY_TOKEN);
    await page.click("#token-ok");
    await page.waitForFunction(() => document.body.dataset.live === "1" && !document.querySelector("#token-dialog").open);
    await page.waitForSelector('#jobs tr[data-job]');
    assert.match(await page.textContent("#jobs"), /token-job/);
    // The header says who the token is (the bootstrap admin here).
    await page.waitForFunction(() => document.querySelector("#whoami").textContent === "admin (admin)");
    assert.deepEqual(errors, []);
    console.log("token prompt: wrong token refused, right token accepted, jobs listed, live");
  } finally {
    await browser.close();
  }
}

main().then(() => process.exit(0), (e) => { console.error("token test failed:", e && e.stack || e); process.exit(1); });
