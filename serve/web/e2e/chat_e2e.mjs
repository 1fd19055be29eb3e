// End-to-end test of the RUDA web chat page in Debian's headless Chromium (playwright-core).
//
//   node chat_e2e.mjs SERVER_URL SCREENSHOT.png [--mock] [--api-key KEY] [--chromium PATH]
//
// Against any server: loads the page, checks the model list (the first model selected), sends a
// message and watches the streamed reply appear and grow, sends a long one and presses Stop
// (the partial reply stays, also after a reload), checks that the page made no request off its
// origin and threw no error, saves a screenshot, then checks Clear.
// With --mock (serve/web/e2e/mock_server.mjs): also the exact models, the request body and
// bearer header the server got, thinking in a collapsed <details>, Markdown, hostile Markdown
// (no script runs, no <img>), an OpenAI error envelope shown readably, inline <think> tags, and
// that the server saw the aborted stream.
// Prints `ok N - step` lines and ends with `N passed, N failed`; exit status 0 only if all pass.

import { chromium } from 'playwright-core';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const argv = process.argv.slice(2);
const flag = (name) => {
  const i = argv.indexOf(name);
  if (i < 0) return undefined;
  const v = argv[i + 1];
  argv.splice(i, 2);
  return v;
};
const mock = argv.includes('--mock');
if (mock) argv.splice(argv.indexOf('--mock'), 1);
const apiKey = flag('--api-key') ?? (mock ? 'test-key' : '');
const executablePath = flag('--chromium') ?? '/usr/bin/chromium';
const [serverUrl, screenshot] = argv;
if (!serverUrl || !screenshot) {
  console.error('usage: node chat_e2e.mjs SERVER_URL SCREENSHOT.png [--mock] [--api-key KEY] [--chromium PATH]');
  process.exit(2);
}
const origin = new URL(serverUrl).origin;

const HARD_TIMEOUT_MS = 180_000;
const killer = setTimeout(() => {
  console.error(`not ok - the whole test ran past ${HARD_TIMEOUT_MS / 1000} s`);
  console.log('0 passed, 1 failed');
  process.exit(1);
}, HARD_TIMEOUT_MS);

let passed = 0;
let failed = 0;
const t0 = Date.now();
async function step(name, fn) {
  const start = Date.now();
  try {
    await fn();
    passed++;
    console.log(`ok ${passed + failed} - ${name} (${Date.now() - start} ms)`);
  } catch (e) {
    failed++;
    console.log(`not ok ${passed + failed} - ${name}\n  ${String(e && e.stack ? e.stack : e).split('\n').join('\n  ')}`);
    throw e;
  }
}
function check(cond, message) {
  if (!cond) throw new Error(message);
}

const userDataDir = mkdtempSync(join(tmpdir(), 'ruda-chat-e2e-'));
const context = await chromium.launchPersistentContext(userDataDir, {
  executablePath,
  headless: true,
  args: [
    '--headless',
    '--no-sandbox',
    '--disable-gpu',
    '--disable-quic',
    '--no-first-run',
    '--disable-background-networking',
    '--disable-component-update',
    '--disable-sync',
  ],
  viewport: { width: 1280, height: 860 },
  colorScheme: 'light',
});
const page = context.pages()[0] ?? (await context.newPage());
page.setDefaultTimeout(30_000);

const offOrigin = [];
const pageErrors = [];
page.on('request', (r) => {
  const u = r.url();
  if (!u.startsWith(origin + '/') && !u.startsWith('data:')) offOrigin.push(u);
});
page.on('pageerror', (e) => pageErrors.push(String(e)));
page.on('console', (m) => {
  if (m.type() === 'error' && !/Failed to load resource/.test(m.text())) pageErrors.push(`console: ${m.text()}`);
});

const last = '#messages .msg.assistant:last-of-type';
const lastState = () => page.getAttribute(last, 'data-state');
const lastText = () => page.textContent(`${last} .content`);
const mockState = async () => (await (await fetch(`${origin}/mock/state`)).json());

async function sendMessage(text) {
  const before = await page.locator('#messages .msg.assistant').count();
  await page.fill('#input', text);
  await page.press('#input', 'Enter');
  await page.waitForFunction((n) => document.querySelectorAll('#messages .msg.assistant').length === n + 1, before);
}
async function waitDone(timeout = 60_000) {
  await page.waitForFunction(
    (sel) => {
      const s = document.querySelector(sel)?.dataset.state;
      return s && s !== 'streaming';
    },
    last,
    { timeout },
  );
}

let ok = false;
try {
  await step('the page loads with its own files only', async () => {
    const res = await page.goto(serverUrl, { waitUntil: 'load' });
    check(res && res.ok(), `GET ${serverUrl}: ${res && res.status()}`);
    check((await page.title()) === 'RUDA chat', `title: ${await page.title()}`);
    await page.waitForSelector('#input');
  });

  let models = [];
  await step('the model list comes from /v1/models, the first selected', async () => {
    await page.waitForFunction(() => [...document.querySelectorAll('#model option')].some((o) => o.value));
    models = await page.$$eval('#model option', (os) => os.map((o) => o.value));
    const selected = await page.inputValue('#model');
    check(models.length >= 1 && models.every(Boolean), `models: ${JSON.stringify(models)}`);
    check(selected === models[0], `selected ${selected}, first ${models[0]}`);
    if (mock) check(JSON.stringify(models) === '["mock-qwen3","mock-other"]', `mock models: ${JSON.stringify(models)}`);
    console.log(`  models: ${models.join(', ')}`);
  });

  await step('settings: system prompt, greedy temperature, seed, max_tokens, API key', async () => {
    await page.fill('#system', 'You are a concise assistant.');
    await page.fill('#temperature', '0');
    await page.fill('#seed', '7');
    // The bundled tiny model has 256 positions: its prompt and reply must fit.
    await page.fill('#max_tokens', mock ? '300' : '24');
    if (apiKey) {
      await page.fill('#api-key', apiKey);
      await page.dispatchEvent('#api-key', 'change');
      await page.waitForFunction(() => [...document.querySelectorAll('#model option')].some((o) => o.value));
    }
  });

  await step('a message streams a reply that appears and grows', async () => {
    await sendMessage(
      // The bundled tiny model has 256 positions for the whole conversation: short turns.
      mock ? 'hello' : 'Hi! What is a GPU kernel?',
    );
    const lengths = [];
    const deadline = Date.now() + 90_000;
    for (;;) {
      const [state, text] = await Promise.all([lastState(), lastText()]);
      const n = (text || '').length;
      if (n > 0 && lengths[lengths.length - 1] !== n) lengths.push(n);
      if (state !== 'streaming') break;
      check(Date.now() < deadline, 'the reply did not finish in 90 s');
      await page.waitForTimeout(25);
    }
    check(lengths.length >= 2, `the reply did not grow while streaming (lengths seen: ${lengths})`);
    const state = await lastState();
    if (state !== 'done') {
      const err = await page.locator(`${last} .error`).textContent({ timeout: 1000 }).catch(() => '');
      throw new Error(`the reply ended in state ${state}: ${err}`);
    }
    check(await page.isEnabled('#send'), 'Send stays disabled');
    console.log(`  reply lengths while streaming: ${lengths.slice(0, 8).join(', ')}${lengths.length > 8 ? ', …' : ''} (${lengths.length} sizes)`);
  });

  if (mock) {
    await step('mock: the request carried stream_options, settings, system prompt and bearer key', async () => {
      const s = await mockState();
      const b = s.lastRequest;
      check(b.model === 'mock-qwen3' && b.stream === true, JSON.stringify(b));
      check(b.stream_options?.include_usage === true, 'stream_options.include_usage');
      check(b.temperature === 0 && b.seed === 7 && b.max_tokens === 300 && b.top_k === 20, JSON.stringify(b));
      check(b.messages[0].role === 'system' && b.messages[0].content === 'You are a concise assistant.', JSON.stringify(b.messages));
      check(b.messages[1].role === 'user' && b.messages[1].content === 'hello', JSON.stringify(b.messages));
      check(s.lastHeaders.authorization === 'Bearer test-key', `authorization: ${s.lastHeaders.authorization}`);
    });

    await step('mock: thinking in a collapsed <details>, Markdown rendered, usage shown', async () => {
      const first = '#messages .msg.assistant >> nth=0';
      const det = page.locator(`${first} >> details.thinking`);
      check(await det.isVisible(), 'thinking block not shown');
      check(!(await det.evaluate((d) => d.open)), 'thinking block is open');
      const thought = await det.locator('pre').textContent();
      check(thought.includes('The user greets me.') && thought.includes('short Markdown demo'), `thinking: ${thought}`);
      const content = page.locator(`${first} >> .content`);
      check((await content.locator('h2').textContent()) === 'Hello from the mock', 'h2');
      check((await content.locator('strong').first().textContent()) === 'streamed', 'strong');
      check((await content.locator('.code-lang').textContent()) === 'rust', 'code label');
      check((await content.locator('pre code').textContent()).includes('héllo, wörld ✓'), 'UTF-8 split across writes');
      check((await content.locator('b').count()) === 0, 'raw <b> became an element');
      check((await content.textContent()).includes('<b>not bold</b>'), 'raw HTML not shown as text');
      check((await content.textContent()).includes('ünïcödé 😀'), 'emoji');
      const meta = await page.locator(`${first} >> .meta`).textContent();
      check(meta.includes('finish: stop') && meta.includes('tokens: 12 in, 9 out'), `meta: ${meta}`);
    });

    await step('mock: hostile Markdown runs no script and loads no image', async () => {
      await sendMessage('xss please');
      await waitDone();
      check((await page.evaluate(() => window.__pwned)) === undefined, 'a payload ran');
      check((await page.locator('#messages img, #messages script, #messages iframe').count()) === 0, 'an element got through');
      check((await page.locator('#messages a[href^="javascript"]').count()) === 0, 'javascript: link');
      const rel = await page.getAttribute(`${last} .content a[href="https://example.com"]`, 'rel');
      check(rel && rel.includes('noopener'), `rel: ${rel}`);
      check((await lastText()).includes('<script>window.__pwned = 1</script>'), 'script shown as text');
    });

    await step('mock: an OpenAI error envelope is shown readably', async () => {
      await sendMessage('error please');
      await waitDone();
      check((await lastState()) === 'error', `state: ${await lastState()}`);
      const err = await page.textContent(`${last} .error`);
      check(
        err.includes('HTTP 400') && err.includes('the mock refuses this prompt on purpose') && err.includes('type: invalid_request_error') && err.includes('code: mock_error'),
        `error text: ${err}`,
      );
    });

    await step('mock: inline <think> tags split across chunks go to the thinking block', async () => {
      await sendMessage('inline thinking');
      await waitDone();
      check((await page.textContent(`${last} details.thinking pre`)) === 'Inline thinking.', 'inline thinking');
      check((await lastText()).trim() === 'Inline answer.', `answer: ${await lastText()}`);
    });
  }

  let partial = '';
  await step('Stop ends a long reply; the partial reply stays', async () => {
    await page.fill('#max_tokens', mock ? '2000' : '80');
    const enough = mock ? 150 : 20;
    await sendMessage(mock ? 'long reply please' : 'Tell a long story.');
    await page.waitForFunction(
      ([sel, n]) => (document.querySelector(sel)?.textContent || '').length > n,
      [`${last} .content`, enough],
      { timeout: 90_000 },
    );
    check((await lastState()) === 'streaming', `the long reply finished before Stop (${await lastState()})`);
    check(await page.isEnabled('#stop'), 'Stop disabled while streaming');
    await page.click('#stop');
    await page.waitForFunction((sel) => document.querySelector(sel)?.dataset.state === 'stopped', last, { timeout: 10_000 });
    partial = await lastText();
    await page.waitForTimeout(800);
    check((await lastText()) === partial, 'the reply kept growing after Stop');
    check(partial.length > enough, `partial reply: ${partial.length} chars`);
    check((await page.textContent(`${last} .meta`)).includes('stopped'), 'no "stopped" mark');
    check(await page.isEnabled('#send'), 'Send stays disabled after Stop');
    check(await page.isDisabled('#stop'), 'Stop still enabled');
    if (mock) {
      check((await lastText()).includes('word1 ') && !(await lastText()).includes('word299'), 'mock partial');
      const s = await mockState();
      check(s.aborted >= 1, 'the server did not see the stream aborted');
    }
    console.log(`  partial reply kept: ${partial.length} chars`);
  });

  await step('the conversation survives a reload (localStorage); the API key stays out of it', async () => {
    const count = await page.locator('#messages .msg').count();
    await page.reload({ waitUntil: 'load' });
    await page.waitForFunction((n) => document.querySelectorAll('#messages .msg').length === n, count);
    check((await lastText()) === partial, 'the partial reply changed across the reload');
    check((await lastState()) === 'stopped', `state after reload: ${await lastState()}`);
    check((await page.inputValue('#system')) === 'You are a concise assistant.', 'system prompt lost');
    check((await page.inputValue('#temperature')) === '0', 'temperature lost');
    const stored = await page.evaluate(() => JSON.stringify(localStorage));
    if (apiKey) {
      check(!stored.includes(apiKey), 'the API key is in localStorage');
      check((await page.inputValue('#api-key')) === apiKey, 'the API key did not survive the reload in this tab');
    }
  });

  await step('no request left the origin and the page threw no error', async () => {
    check(offOrigin.length === 0, `off-origin requests: ${offOrigin.join(', ')}`);
    check(pageErrors.length === 0, `page errors: ${pageErrors.join(' | ')}`);
  });

  await step(`screenshot saved to ${screenshot}`, async () => {
    // show the first reply, its thinking opened, at the top of the conversation
    await page.evaluate(() => {
      const first = document.querySelector('#messages .msg.assistant details.thinking:not([hidden])');
      if (first) first.open = true;
      document.getElementById('messages').scrollTop = 0;
    });
    await page.screenshot({ path: screenshot });
  });

  await step('Clear empties the conversation and its storage', async () => {
    await page.click('#clear');
    check((await page.locator('#messages .msg').count()) === 0, 'messages left');
    const saved = await page.evaluate(() => JSON.parse(localStorage.getItem('ruda-chat:v1')).messages.length);
    check(saved === 0, `stored messages: ${saved}`);
  });
  ok = true;
} catch {
  await page.screenshot({ path: screenshot.replace(/(\.png)?$/, '.failed.png') }).catch(() => {});
  if (pageErrors.length) console.log(`  page errors: ${pageErrors.join(' | ')}`);
} finally {
  await context.close().catch(() => {});
  rmSync(userDataDir, { recursive: true, force: true });
  clearTimeout(killer);
}
console.log(`# e2e ${mock ? 'against the mock ' : ''}took ${((Date.now() - t0) / 1000).toFixed(1)} s`);
console.log(`${passed} passed, ${failed} failed`);
process.exit(ok && failed === 0 ? 0 : 1);
