// The RUDA web chat page: DOM and network glue over the pure functions of chat.js.
// Model text reaches the DOM only as textContent or through renderMarkdown (which escapes it).

import {
  applyChunk,
  buildRequest,
  DEFAULT_SETTINGS,
  formatHttpError,
  loadState,
  messageParts,
  modelIds,
  newAssistantMessage,
  readSseEvents,
  renderMarkdown,
  requestHeaders,
  saveState,
} from './chat.js';

const $ = (id) => document.getElementById(id);
const el = {
  model: $('model'),
  clear: $('clear'),
  system: $('system'),
  apiKey: $('api-key'),
  resetSettings: $('reset-settings'),
  messages: $('messages'),
  status: $('status'),
  composer: $('composer'),
  input: $('input'),
  send: $('send'),
  stop: $('stop'),
};
const SETTING_NAMES = Object.keys(DEFAULT_SETTINGS);
const API_KEY_SESSION = 'ruda-chat:api-key';

const state = loadState(localStorage);
let controller = null; // the AbortController of the reply being streamed
let errorBanner = null;

function save() {
  if (!saveState(localStorage, state)) setStatus('could not save the conversation (storage full?)');
}

function setStatus(text) {
  el.status.textContent = text;
}

function apiKey() {
  return el.apiKey.value;
}

// ---------------------------------------------------------------------------------------------
// Rendering

function messageView(msg) {
  const div = document.createElement('div');
  div.className = `msg ${msg.role}`;
  const role = document.createElement('div');
  role.className = 'role';
  role.textContent = msg.role === 'user' ? 'You' : msg.model || 'Assistant';
  div.append(role);
  if (msg.role === 'user') {
    const body = document.createElement('div');
    body.className = 'text';
    body.textContent = msg.content;
    div.append(body);
    return { div, update() {} };
  }
  const details = document.createElement('details');
  details.className = 'thinking';
  const summary = document.createElement('summary');
  const thought = document.createElement('pre');
  details.append(summary, thought);
  const body = document.createElement('div');
  body.className = 'content markdown';
  const foot = document.createElement('div');
  foot.className = 'meta';
  div.append(details, body, foot);

  function update(streaming) {
    const parts = messageParts(msg, { streaming });
    details.hidden = parts.thinking === '';
    summary.textContent = parts.thinkingOpen ? 'Thinking…' : `Thoughts (${parts.thinking.length} chars)`;
    if (thought.textContent !== parts.thinking) thought.textContent = parts.thinking;
    body.innerHTML = renderMarkdown(parts.answer); // escaped by renderMarkdown
    div.dataset.state = streaming ? 'streaming' : msg.error ? 'error' : msg.stopped ? 'stopped' : 'done';
    const bits = [];
    if (msg.stopped) bits.push('stopped');
    if (msg.finishReason) bits.push(`finish: ${msg.finishReason}`);
    if (msg.usage) {
      const u = msg.usage;
      bits.push(`tokens: ${u.prompt_tokens ?? '?'} in, ${u.completion_tokens ?? '?'} out`);
    }
    if (msg.tokensPerSecond) bits.push(`${msg.tokensPerSecond.toFixed(1)} tok/s`);
    foot.textContent = bits.join(' · ');
    if (msg.error) {
      let err = div.querySelector('.error');
      if (!err) {
        err = document.createElement('div');
        err.className = 'error';
        div.append(err);
      }
      err.textContent = msg.error;
    }
  }
  update(false);
  return { div, update };
}

function renderAll() {
  el.messages.replaceChildren();
  for (const msg of state.messages) el.messages.append(messageView(msg).div);
  scrollDown(true);
}

function scrollDown(force) {
  const m = el.messages;
  if (force || m.scrollHeight - m.scrollTop - m.clientHeight < 80) m.scrollTop = m.scrollHeight;
}

function showError(text) {
  if (!errorBanner) {
    errorBanner = document.createElement('div');
    errorBanner.className = 'error banner';
    el.messages.before(errorBanner);
  }
  errorBanner.textContent = text;
  errorBanner.hidden = !text;
}

// ---------------------------------------------------------------------------------------------
// Models

async function loadModels() {
  try {
    const res = await fetch('v1/models', { headers: requestHeaders(apiKey(), false) });
    const text = await res.text();
    if (!res.ok) throw new Error(formatHttpError(res.status, res.statusText, text));
    const ids = modelIds(JSON.parse(text));
    el.model.replaceChildren();
    for (const id of ids) el.model.append(new Option(id, id));
    if (ids.length === 0) {
      el.model.append(new Option('(no models)', ''));
      throw new Error('the server lists no models');
    }
    el.model.value = ids.includes(state.model) ? state.model : ids[0];
    state.model = el.model.value;
    showError('');
  } catch (e) {
    showError(`Could not list models: ${e.message}`);
    if (!el.model.value) {
      el.model.replaceChildren(new Option('(unavailable)', ''));
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Sending

function setBusy(busy) {
  el.send.disabled = busy;
  el.stop.disabled = !busy;
  el.clear.disabled = busy;
  document.body.classList.toggle('busy', busy);
}

async function send(text) {
  if (controller) return;
  showError('');
  const user = { role: 'user', content: text };
  state.messages.push(user);
  el.messages.append(messageView(user).div);
  const msg = newAssistantMessage();
  const history = state.messages.slice();
  state.messages.push(msg);
  save();
  const view = messageView(msg);
  view.update(true);
  el.messages.append(view.div);
  scrollDown(true);

  controller = new AbortController();
  setBusy(true);
  setStatus('waiting for the server…');
  const started = performance.now();
  let firstTokenAt = 0;
  let pending = false;
  const redraw = () => {
    if (pending) return;
    pending = true;
    requestAnimationFrame(() => {
      pending = false;
      view.update(controller !== null);
      scrollDown(false);
    });
  };
  try {
    const body = buildRequest({
      model: el.model.value,
      system: state.system,
      messages: history,
      settings: state.settings,
    });
    const res = await fetch('v1/chat/completions', {
      method: 'POST',
      headers: requestHeaders(apiKey()),
      body: JSON.stringify(body),
      signal: controller.signal,
    });
    if (!res.ok) throw new Error(formatHttpError(res.status, res.statusText, await res.text()));
    setStatus('streaming…');
    for await (const ev of readSseEvents(res.body)) {
      if (ev.event !== 'message' && ev.event !== 'error') continue;
      if (applyChunk(msg, ev.data) === 'done') break;
      if (!firstTokenAt && (msg.content || msg.reasoning)) firstTokenAt = performance.now();
      redraw();
    }
    const tokens = msg.usage?.completion_tokens;
    if (tokens && firstTokenAt) {
      const secs = (performance.now() - firstTokenAt) / 1000;
      if (secs > 0 && tokens > 1) msg.tokensPerSecond = (tokens - 1) / secs;
    }
    setStatus(`done in ${((performance.now() - started) / 1000).toFixed(1)} s`);
  } catch (e) {
    if (e.name === 'AbortError') {
      msg.stopped = true;
      setStatus('stopped');
    } else {
      msg.error = e instanceof TypeError ? `Cannot reach the server: ${e.message}` : e.message;
      setStatus('error');
    }
  } finally {
    controller = null;
    setBusy(false);
    save();
    view.update(false);
    scrollDown(false);
    el.input.focus();
  }
}

// ---------------------------------------------------------------------------------------------
// Wiring

function loadSettingsIntoForm() {
  el.system.value = state.system;
  for (const name of SETTING_NAMES) $(name).value = state.settings[name] ?? '';
}

el.composer.addEventListener('submit', (e) => {
  e.preventDefault();
  const text = el.input.value.trim();
  if (!text || controller) return;
  el.input.value = '';
  send(text);
});

el.input.addEventListener('keydown', (e) => {
  if (e.key === 'Enter' && !e.shiftKey && !e.isComposing) {
    e.preventDefault();
    el.composer.requestSubmit();
  }
});

el.stop.addEventListener('click', () => controller?.abort());

el.clear.addEventListener('click', () => {
  if (controller) return;
  state.messages = [];
  save();
  renderAll();
  setStatus('cleared');
});

el.model.addEventListener('change', () => {
  state.model = el.model.value;
  save();
});

el.system.addEventListener('input', () => {
  state.system = el.system.value;
  save();
});

for (const name of SETTING_NAMES) {
  $(name).addEventListener('input', () => {
    state.settings[name] = $(name).value;
    save();
  });
}

el.resetSettings.addEventListener('click', () => {
  state.settings = { ...DEFAULT_SETTINGS };
  loadSettingsIntoForm();
  save();
});

el.apiKey.value = sessionStorage.getItem(API_KEY_SESSION) || '';
el.apiKey.addEventListener('change', () => {
  if (el.apiKey.value) sessionStorage.setItem(API_KEY_SESSION, el.apiKey.value);
  else sessionStorage.removeItem(API_KEY_SESSION);
  loadModels();
});

// Copy buttons of code blocks (delegated: the buttons come from renderMarkdown's HTML).
el.messages.addEventListener('click', async (e) => {
  const btn = e.target.closest('button.copy-code');
  if (!btn) return;
  const code = btn.closest('.code-block')?.querySelector('code');
  if (!code) return;
  try {
    await navigator.clipboard.writeText(code.textContent);
    btn.textContent = 'Copied';
  } catch {
    btn.textContent = 'Copy failed';
  }
  setTimeout(() => (btn.textContent = 'Copy'), 1500);
});

loadSettingsIntoForm();
renderAll();
loadModels();
el.input.focus();
