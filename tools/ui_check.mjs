// Drives `trit serve`'s chat page in headless Chromium (Debian's, through playwright-core from
// npm; tools/fetch_assets.sh installs it into .cache/ui-test when chromium is present) the way a
// person would: the first message from the page's ?q=…&send=1 link, a second one typed into the
// box and sent with Enter, then a reload. Prints one JSON line: each turn's reply and stats
// line, the messages shown after the reload, and any page errors. Used by crates/trit-server/tests/ui.rs.
//
// usage: [UI_API_KEY=KEY] node tools/ui_check.mjs http://127.0.0.1:PORT CHROMIUM_PATH
import { createRequire } from "node:module";
import path from "node:path";

const [, , base, chromium] = process.argv;
const require = createRequire(path.resolve(process.env.UI_TEST_MODULES ?? ".cache/ui-test") + "/");
const { chromium: launcher } = require("playwright-core");

const browser = await launcher.launch({ executablePath: chromium, args: ["--no-sandbox"] });
const errors = [];
try {
  const page = await browser.newPage();
  // The server's API key, as a person would have entered it in Settings.
  if (process.env.UI_API_KEY) {
    await page.addInitScript((k) => localStorage.setItem("trit.api_key", k), process.env.UI_API_KEY);
  }
  // Replies of at most 64 tokens (Settings' max tokens): a sampled reply that ran to the
  // context's end left the second turn no room (an error instead of a reply).
  await page.addInitScript(() => localStorage.setItem("trit.max_tokens", "64"));
  page.on("pageerror", (e) => errors.push(String(e)));
  const turn = async (n) => {
    // A turn is done when its stats line is filled in.
    await page.waitForFunction(
      (n) => {
        const s = document.querySelectorAll(".msg.assistant .stats");
        return s.length >= n && s[n - 1].textContent.length > 0;
      },
      n,
      { timeout: 60000 },
    );
    return page.evaluate((n) => {
      const b = document.querySelectorAll(".msg.assistant")[n - 1];
      return { reply: b.querySelector(".reply").textContent, stats: b.querySelector(".stats").textContent };
    }, n);
  };
  await page.goto(base + "/?q=" + encodeURIComponent("What is the capital of France?") + "&send=1");
  const first = await turn(1);
  await page.fill("#input", "And of Italy?");
  await page.press("#input", "Enter");
  const second = await turn(2);
  const model = await page.textContent("#model");
  // A reload keeps the conversation (localStorage).
  await page.reload();
  await page.waitForSelector(".msg.assistant");
  const restored = await page.$$eval(".msg", (ms) => ms.map((m) => m.classList[1] + ": " +
    (m.querySelector(".reply") ? m.querySelector(".reply").textContent : m.textContent)));
  console.log(JSON.stringify({ model, turns: [first, second], restored, errors }));
} finally {
  await browser.close();
}
