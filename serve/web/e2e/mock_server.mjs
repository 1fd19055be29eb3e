// A stand-in for `ruda-llm serve` for the web chat's e2e test: serves the page files from
// serve/web/ and fakes GET /v1/models and a streaming POST /v1/chat/completions (OpenAI SSE
// chunks with delays, reasoning_content first, writes split mid-line and mid-UTF-8).
//
//   node mock_server.mjs [--port N]      (default 0: any free port; loopback only)
// prints `MOCK LISTENING http://127.0.0.1:PORT` once listening.
//
// The last user message picks the reply: containing "long" -> 300 slow chunks (for Stop);
// "error" -> HTTP 400 with an OpenAI error envelope; "xss" -> hostile Markdown; "inline" ->
// thinking inline as <think>...</think> in content; anything else -> a short Markdown reply.
// GET /mock/state returns the last request's body and headers and the count of aborted streams.

import { createServer } from 'node:http';
import { readFile } from 'node:fs/promises';
import { fileURLToPath } from 'node:url';

const WEB = fileURLToPath(new URL('..', import.meta.url));
const FILES = {
  '/': ['index.html', 'text/html; charset=utf-8'],
  '/index.html': ['index.html', 'text/html; charset=utf-8'],
  '/app.js': ['app.js', 'text/javascript; charset=utf-8'],
  '/chat.js': ['chat.js', 'text/javascript; charset=utf-8'],
  '/style.css': ['style.css', 'text/css; charset=utf-8'],
};
const MODELS = ['mock-qwen3', 'mock-other'];

const args = process.argv.slice(2);
const portArg = args.indexOf('--port');
const port = portArg >= 0 ? Number(args[portArg + 1]) : 0;

const state = { lastRequest: null, lastHeaders: null, aborted: 0, completions: 0 };

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

function json(res, status, body) {
  res.writeHead(status, { 'Content-Type': 'application/json' });
  res.end(JSON.stringify(body));
}

function apiError(res, status, message, type, param = null, code = null) {
  json(res, status, { error: { message, type, param, code } });
}

const REPLY = [
  '## Hello from the mock\n\n',
  'This reply is **streamed** in ',
  'pieces, with *Markdown*:\n\n',
  '- a list item with `inline code`\n',
  '- raw HTML stays text: <b>not bold</b>\n\n',
  '```rust\n',
  'fn main() {\n    println!("héllo, wörld ✓");\n}\n',
  '```\n\n',
  'Done — ünïcödé 😀.',
];
const THINKING = ['The user greets me. ', 'I should answer ', 'with a short Markdown demo.'];
const XSS = [
  '<script>window.__pwned = 1</script>\n\n',
  '<img src=x onerror="window.__pwned = 2">\n\n',
  '[click](javascript:window.__pwned=3) and [ok](https://example.com)\n\n',
  '```"><img src=x onerror="window.__pwned=4">\n<script>window.__pwned=5</script>\n```\n',
];

async function completions(req, res, body) {
  if (body.stream !== true) return apiError(res, 400, 'this mock only streams', 'invalid_request_error', 'stream');
  if (!MODELS.includes(body.model)) {
    return apiError(res, 404, `model '${body.model}' not found`, 'invalid_request_error', 'model', 'model_not_found');
  }
  const last = [...(body.messages || [])].reverse().find((m) => m.role === 'user')?.content || '';
  if (/error/i.test(last)) {
    return apiError(res, 400, 'the mock refuses this prompt on purpose', 'invalid_request_error', 'messages', 'mock_error');
  }
  state.completions++;
  res.writeHead(200, {
    'Content-Type': 'text/event-stream',
    'Cache-Control': 'no-cache',
    Connection: 'keep-alive',
  });
  let closed = false;
  res.on('close', () => {
    if (!res.writableFinished) {
      closed = true;
      state.aborted++;
    }
  });
  const id = `chatcmpl-mock-${state.completions}`;
  const created = Math.floor(Date.now() / 1000);
  const chunk = (delta, finish = null) =>
    `data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created, model: body.model, choices: [{ index: 0, delta, finish_reason: finish }] })}\n\n`;
  // write one event's bytes in two pieces cut at an arbitrary byte (mid-line, mid-UTF-8)
  let cut = 0;
  const send = async (text, delay) => {
    if (closed) return;
    const bytes = Buffer.from(text, 'utf8');
    const at = bytes.length > 1 ? 1 + ((cut++ * 7) % (bytes.length - 1)) : bytes.length;
    res.write(bytes.subarray(0, at));
    await sleep(2);
    if (closed) return;
    res.write(bytes.subarray(at));
    await sleep(delay);
  };

  await send(chunk({ role: 'assistant', content: '' }), 20);
  await send(': keep-alive comment\n\n', 5);
  let pieces;
  let delay = 60;
  if (/long/i.test(last)) {
    for (const t of THINKING) await send(chunk({ reasoning_content: t }), 30);
    pieces = Array.from({ length: 300 }, (_, i) => `word${i} `);
    delay = 40;
  } else if (/xss/i.test(last)) {
    pieces = XSS;
  } else if (/inline/i.test(last)) {
    pieces = ['<think>\nInline ', 'thinking.\n</th', 'ink>\n\nInline answer.'];
  } else {
    for (const t of THINKING) await send(chunk({ reasoning_content: t }), 40);
    pieces = REPLY;
  }
  let n = 0;
  for (const p of pieces) {
    if (closed) return;
    await send(chunk({ content: p }), delay);
    n++;
  }
  await send(chunk({}, 'stop'), 5);
  if (body.stream_options?.include_usage) {
    await send(
      `data: ${JSON.stringify({ id, object: 'chat.completion.chunk', created, model: body.model, choices: [], usage: { prompt_tokens: 12, completion_tokens: n, total_tokens: 12 + n } })}\n\n`,
      5,
    );
  }
  if (!closed) res.end('data: [DONE]\n\n');
}

const server = createServer(async (req, res) => {
  const url = new URL(req.url, 'http://mock');
  try {
    if (req.method === 'GET' && FILES[url.pathname]) {
      const [file, type] = FILES[url.pathname];
      res.writeHead(200, { 'Content-Type': type, 'Cache-Control': 'no-store', 'X-Content-Type-Options': 'nosniff' });
      return res.end(await readFile(WEB + file));
    }
    if (req.method === 'GET' && url.pathname === '/v1/models') {
      return json(res, 200, {
        object: 'list',
        data: MODELS.map((id) => ({ id, object: 'model', created: 0, owned_by: 'ruda' })),
      });
    }
    if (req.method === 'GET' && url.pathname === '/mock/state') return json(res, 200, state);
    if (req.method === 'POST' && url.pathname === '/v1/chat/completions') {
      let raw = '';
      for await (const c of req) raw += c;
      let body;
      try {
        body = JSON.parse(raw);
      } catch {
        return apiError(res, 400, 'body is not JSON', 'invalid_request_error');
      }
      state.lastRequest = body;
      state.lastHeaders = { authorization: req.headers.authorization ?? null, 'content-type': req.headers['content-type'] };
      return await completions(req, res, body);
    }
    apiError(res, 404, `no route for ${req.method} ${url.pathname}`, 'invalid_request_error', null, 'not_found');
  } catch (e) {
    if (!res.headersSent) apiError(res, 500, String(e), 'server_error');
    else res.destroy();
  }
});

server.listen(port, '127.0.0.1', () => {
  console.log(`MOCK LISTENING http://127.0.0.1:${server.address().port}`);
});
for (const sig of ['SIGINT', 'SIGTERM']) {
  process.on(sig, () => {
    server.close(() => process.exit(0));
    server.closeAllConnections();
    setTimeout(() => process.exit(0), 500).unref();
  });
}
