import { test } from 'node:test';
import assert from 'node:assert/strict';
import {
  applyChunk,
  buildRequest,
  DEFAULT_SETTINGS,
  formatApiError,
  formatHttpError,
  loadState,
  messageParts,
  modelIds,
  newAssistantMessage,
  requestHeaders,
  saveState,
  splitThinking,
  STORAGE_KEY,
} from '../chat.js';

test('splitThinking: tags, a closing tag without its opener, an open block, none', () => {
  assert.deepEqual(splitThinking('<think>\nplan\n</think>\n\nAnswer.'), { thinking: 'plan', answer: 'Answer.', open: false });
  assert.deepEqual(splitThinking('plan</think>Answer'), { thinking: 'plan', answer: 'Answer', open: false });
  assert.deepEqual(splitThinking('<think>still going'), { thinking: 'still going', answer: '', open: true });
  assert.deepEqual(splitThinking('just text'), { thinking: '', answer: 'just text', open: false });
  assert.deepEqual(splitThinking('<think>\n\n</think>\n\nHi'), { thinking: '', answer: 'Hi', open: false });
  assert.deepEqual(splitThinking('<think>a</think>x<think>b</think>y'), { thinking: 'a\n\nb', answer: 'xy', open: false });
  assert.deepEqual(splitThinking(''), { thinking: '', answer: '', open: false });
});

test('splitThinking while streaming holds back a partial tag', () => {
  assert.deepEqual(splitThinking('<thi', { streaming: true }), { thinking: '', answer: '', open: false });
  assert.deepEqual(splitThinking('<think>abc</thi', { streaming: true }), { thinking: 'abc', answer: '', open: true });
  assert.equal(splitThinking('a <', { streaming: true }).answer, 'a');
  assert.equal(splitThinking('a <', { streaming: false }).answer, 'a <');
  assert.equal(splitThinking('x < y', { streaming: true }).answer, 'x < y');
});

test('every prefix of a streamed thinking reply splits without tag debris', () => {
  const full = '<think>\nLet me think.\n</think>\n\nThe answer is 42.';
  for (let i = 0; i <= full.length; i++) {
    const { thinking, answer } = splitThinking(full.slice(0, i), { streaming: true });
    assert.doesNotMatch(thinking + answer, /<\/?t/, `prefix ${i}`);
    assert.ok('Let me think.'.startsWith(thinking), `prefix ${i}: ${thinking}`);
    assert.ok('The answer is 42.'.startsWith(answer), `prefix ${i}: ${answer}`);
  }
});

test('messageParts joins reasoning_content and inline thinking', () => {
  const m = { content: 'Hi', reasoning: 'why' };
  assert.deepEqual(messageParts(m), { thinking: 'why', answer: 'Hi', thinkingOpen: false });
  assert.deepEqual(messageParts({ content: '', reasoning: 'hmm' }, { streaming: true }), {
    thinking: 'hmm',
    answer: '',
    thinkingOpen: true,
  });
  assert.equal(messageParts({ content: '<think>t</think>a', reasoning: 'r' }).thinking, 'r\n\nt');
});

const delta = (d, extra = {}) =>
  JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', model: 'qwen3', choices: [{ index: 0, delta: d, finish_reason: null, ...extra }] });

test('applyChunk accumulates role, reasoning_content, content, finish_reason, usage, [DONE]', () => {
  const m = newAssistantMessage();
  assert.equal(applyChunk(m, delta({ role: 'assistant' })), 'chunk');
  applyChunk(m, delta({ reasoning_content: 'Think ' }));
  applyChunk(m, delta({ reasoning_content: 'more.' }));
  applyChunk(m, delta({ content: 'Hel' }));
  applyChunk(m, delta({ content: 'lo' }));
  applyChunk(m, delta({}, { finish_reason: 'stop' }));
  applyChunk(m, JSON.stringify({ id: 'c1', object: 'chat.completion.chunk', choices: [], usage: { prompt_tokens: 5, completion_tokens: 7, total_tokens: 12 } }));
  assert.equal(applyChunk(m, '[DONE]'), 'done');
  assert.equal(m.content, 'Hello');
  assert.equal(m.reasoning, 'Think more.');
  assert.equal(m.finishReason, 'stop');
  assert.equal(m.model, 'qwen3');
  assert.deepEqual(m.usage, { prompt_tokens: 5, completion_tokens: 7, total_tokens: 12 });
});

test('applyChunk: other choices ignored, `reasoning` alias, null content', () => {
  const m = newAssistantMessage();
  applyChunk(m, JSON.stringify({ choices: [{ index: 1, delta: { content: 'other' } }] }));
  applyChunk(m, JSON.stringify({ choices: [{ index: 0, delta: { reasoning: 'r', content: null } }] }));
  assert.equal(m.content, '');
  assert.equal(m.reasoning, 'r');
});

test('applyChunk throws readable errors for an error event and for non-JSON data', () => {
  const m = newAssistantMessage();
  assert.throws(
    () => applyChunk(m, JSON.stringify({ error: { message: 'out of memory', type: 'server_error', param: null, code: 'oom' } })),
    { message: 'out of memory (type: server_error, code: oom)' },
  );
  assert.throws(() => applyChunk(m, 'not json'), /bad stream data/);
});

test('formatApiError and formatHttpError read the OpenAI error envelope', () => {
  assert.equal(
    formatApiError({ message: "'messages' is required", type: 'invalid_request_error', param: 'messages', code: null }),
    "'messages' is required (type: invalid_request_error, param: messages)",
  );
  assert.equal(formatApiError('plain'), 'plain');
  assert.equal(formatApiError({}), 'unknown error');
  const env = JSON.stringify({ error: { message: 'model "x" not found', type: 'invalid_request_error', param: 'model', code: 'model_not_found' } });
  assert.equal(
    formatHttpError(404, 'Not Found', env),
    'HTTP 404 Not Found: model "x" not found (type: invalid_request_error, param: model, code: model_not_found)',
  );
  assert.equal(formatHttpError(502, 'Bad Gateway', '<html>oops</html>'), 'HTTP 502 Bad Gateway: <html>oops</html>');
  assert.equal(formatHttpError(500, '', ''), 'HTTP 500');
  assert.match(formatHttpError(500, '', 'x'.repeat(1000)), /^HTTP 500: x{300}…$/);
});

test('buildRequest: system prompt, history without thinking or errors, streaming with usage, settings', () => {
  const body = buildRequest({
    model: 'qwen3-0.6b',
    system: 'Be brief.',
    messages: [
      { role: 'user', content: 'hi' },
      { role: 'assistant', content: '<think>hmm</think>Hello!', reasoning: 'r' },
      { role: 'user', content: 'again' },
      { role: 'assistant', content: '', error: 'HTTP 500' },
      { role: 'user', content: 'third' },
    ],
    settings: { temperature: '0', top_p: '0.9', top_k: '20', max_tokens: '256', seed: '' },
  });
  assert.deepEqual(body, {
    model: 'qwen3-0.6b',
    messages: [
      { role: 'system', content: 'Be brief.' },
      { role: 'user', content: 'hi' },
      { role: 'assistant', content: 'Hello!' },
      { role: 'user', content: 'again' },
      { role: 'user', content: 'third' },
    ],
    stream: true,
    stream_options: { include_usage: true },
    temperature: 0,
    top_p: 0.9,
    top_k: 20,
    max_tokens: 256,
  });
  const b2 = buildRequest({ model: 'm', system: '  ', messages: [], settings: { seed: '42.7', temperature: 'abc' } });
  assert.equal(b2.seed, 42);
  assert.ok(!('temperature' in b2));
  assert.deepEqual(b2.messages, []);
});

test('requestHeaders sends the API key as a bearer token only when set', () => {
  assert.deepEqual(requestHeaders(''), { Accept: 'text/event-stream', 'Content-Type': 'application/json' });
  assert.equal(requestHeaders(' sk-1 ').Authorization, 'Bearer sk-1');
  assert.deepEqual(requestHeaders('k', false), { Accept: 'application/json', Authorization: 'Bearer k' });
});

test('modelIds reads the OpenAI list shape', () => {
  assert.deepEqual(modelIds({ object: 'list', data: [{ id: 'a', object: 'model' }, { id: 'b' }, { x: 1 }] }), ['a', 'b']);
  assert.deepEqual(modelIds({}), []);
  assert.deepEqual(modelIds(null), []);
});

function memoryStorage() {
  const map = new Map();
  return { getItem: (k) => (map.has(k) ? map.get(k) : null), setItem: (k, v) => map.set(k, String(v)), map };
}

test('loadState/saveState round-trip and never store the API key', () => {
  const st = memoryStorage();
  const fresh = loadState(st);
  assert.deepEqual(fresh, { messages: [], system: '', settings: { ...DEFAULT_SETTINGS }, model: '' });
  const s = { ...fresh, messages: [{ role: 'user', content: 'x' }], system: 'sys', model: 'm', apiKey: 'secret' };
  assert.equal(saveState(st, s), true);
  assert.doesNotMatch(st.map.get(STORAGE_KEY), /secret/);
  assert.deepEqual(loadState(st), { messages: [{ role: 'user', content: 'x' }], system: 'sys', settings: { ...DEFAULT_SETTINGS }, model: 'm' });
});

test('loadState survives corrupt or hostile storage', () => {
  const st = memoryStorage();
  st.setItem(STORAGE_KEY, '{not json');
  assert.deepEqual(loadState(st).messages, []);
  st.setItem(STORAGE_KEY, JSON.stringify({ messages: [{ role: 'user' }, null, { role: 'user', content: 'ok' }], settings: 'x' }));
  const s = loadState(st);
  assert.deepEqual(s.messages, [{ role: 'user', content: 'ok' }]);
  assert.deepEqual(s.settings, { ...DEFAULT_SETTINGS });
  assert.equal(loadState({ getItem() { throw new Error('denied'); } }).messages.length, 0);
  assert.equal(saveState({ setItem() { throw new Error('quota'); } }, s), false);
});
