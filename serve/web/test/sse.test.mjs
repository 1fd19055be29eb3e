import { test } from 'node:test';
import assert from 'node:assert/strict';
import { createSseParser, parseSseChunk, readSseEvents } from '../chat.js';

const chunk = (content) =>
  `data: ${JSON.stringify({ object: 'chat.completion.chunk', choices: [{ index: 0, delta: { content } }] })}\n\n`;

test('one complete stream parses into its data events and [DONE]', () => {
  const text = chunk('Hel') + chunk('lo') + 'data: [DONE]\n\n';
  const evs = parseSseChunk(text);
  assert.equal(evs.length, 3);
  assert.equal(JSON.parse(evs[0].data).choices[0].delta.content, 'Hel');
  assert.equal(evs[2].data, '[DONE]');
  assert.ok(evs.every((e) => e.event === 'message'));
});

test('events split at every possible position give the same events', () => {
  const text = ': keep-alive\n\n' + chunk('a') + 'event: ping\ndata: x\n\n' + chunk('é€😀') + 'data: [DONE]\n\n';
  const whole = parseSseChunk(text);
  assert.equal(whole.length, 4);
  for (let i = 0; i <= text.length; i++) {
    for (const j of [i, Math.min(text.length, i + 1), Math.min(text.length, i + 7)]) {
      const p = createSseParser();
      const got = [...p.push(text.slice(0, i)), ...p.push(text.slice(i, j)), ...p.push(text.slice(j)), ...p.end()];
      assert.deepEqual(got, whole, `split at ${i},${j}`);
    }
  }
});

test('one character at a time', () => {
  const text = chunk('x') + 'data: [DONE]\n\n';
  const p = createSseParser();
  const got = [];
  for (const c of text) got.push(...p.push(c));
  assert.equal(got.length, 2);
  assert.equal(got[1].data, '[DONE]');
});

test('CRLF and lone CR line endings, also with CR and LF in different reads', () => {
  const crlf = 'data: a\r\n\r\ndata: [DONE]\r\n\r\n';
  assert.deepEqual(parseSseChunk(crlf).map((e) => e.data), ['a', '[DONE]']);
  assert.deepEqual(parseSseChunk('data: a\r\rdata: b\r\r').map((e) => e.data), ['a', 'b']);
  const p = createSseParser();
  assert.deepEqual(p.push('data: a\r'), []);
  // the LF completes the CRLF, it is not a second (blank) line
  assert.deepEqual(p.push('\n'), []);
  assert.deepEqual(p.push('\r\n').map((e) => e.data), ['a']);
});

test('comment lines and keep-alives dispatch nothing', () => {
  assert.deepEqual(parseSseChunk(': ping\n\n:\n\n: another\n'), []);
  assert.deepEqual(parseSseChunk(': c\ndata: x\n: c2\n\n').map((e) => e.data), ['x']);
});

test('multi-line data, field without space, event and id fields', () => {
  const evs = parseSseChunk('id: 7\nevent: error\ndata: line1\ndata:line2\n\n');
  assert.deepEqual(evs, [{ event: 'error', data: 'line1\nline2', id: '7' }]);
  assert.deepEqual(parseSseChunk('data\n\n'), [{ event: 'message', data: '', id: undefined }]);
  assert.deepEqual(parseSseChunk('data:  two spaces\n\n')[0].data, ' two spaces');
});

test('a blank line without data dispatches nothing; retry and unknown fields ignored', () => {
  assert.deepEqual(parseSseChunk('retry: 1000\n\nfoo: bar\n\n'), []);
});

test('a last event without its blank line is flushed by end()', () => {
  const p = createSseParser();
  assert.deepEqual(p.push('data: [DONE]'), []);
  assert.deepEqual(p.end().map((e) => e.data), ['[DONE]']);
  assert.deepEqual(p.end(), []);
});

test('readSseEvents decodes UTF-8 split across reads', async () => {
  const bytes = new TextEncoder().encode(chunk('naïve € 😀 日本') + 'data: [DONE]\n\n');
  // cut the bytes into 1-3 byte reads, so multi-byte characters are split
  const pieces = [];
  for (let i = 0, k = 0; i < bytes.length; k++) {
    const n = 1 + (k % 3);
    pieces.push(bytes.slice(i, i + n));
    i += n;
  }
  const stream = new ReadableStream({
    start(c) {
      for (const p of pieces) c.enqueue(p);
      c.close();
    },
  });
  const got = [];
  for await (const ev of readSseEvents(stream)) got.push(ev.data);
  assert.equal(got.length, 2);
  assert.equal(JSON.parse(got[0]).choices[0].delta.content, 'naïve € 😀 日本');
  assert.equal(got[1], '[DONE]');
});
