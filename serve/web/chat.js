// Pure functions of the RUDA web chat: no DOM, no network, so Node's test runner can load them.
// The page (app.js) imports this module; serve/web/test/*.test.mjs test it.
//
// Security rule of this file: every piece of model or server text that ends up in an HTML
// string goes through escapeHtml. The only tags in renderMarkdown's output are the ones this
// file writes itself, and the only attributes are a sanitized class name, a numeric list
// start, and http(s) link targets (escaped, rel=noopener noreferrer).

// ---------------------------------------------------------------------------------------------
// HTML escaping

const HTML_ESCAPES = { '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' };

/** Escape text for use in HTML element content and in quoted attribute values. */
export function escapeHtml(text) {
  return String(text).replace(/[&<>"']/g, (c) => HTML_ESCAPES[c]);
}

// ---------------------------------------------------------------------------------------------
// Server-sent events

/**
 * An incremental parser of a `text/event-stream` body (the WHATWG rules): push decoded text in
 * pieces split anywhere (mid-line, between CR and LF) and get back the events completed so far.
 * Lines end with LF, CRLF or CR; lines starting with ':' are comments; `data` fields are joined
 * with '\n'; an event is dispatched at a blank line. `end()` dispatches a last event whose blank
 * line never came (lenient: the spec drops it) and resets the parser.
 * Each event: { event: string ('message' by default), data: string, id: string|undefined }.
 */
export function createSseParser() {
  let buffer = '';
  let dataLines = [];
  let eventType = '';
  let lastId;
  let sawField = false;

  function dispatch(out) {
    if (sawField && dataLines.length > 0) {
      out.push({ event: eventType || 'message', data: dataLines.join('\n'), id: lastId });
    }
    dataLines = [];
    eventType = '';
    sawField = false;
  }

  function line(text, out) {
    if (text === '') return dispatch(out);
    if (text[0] === ':') return; // comment (e.g. keep-alive ": ping")
    const colon = text.indexOf(':');
    let field = text;
    let value = '';
    if (colon >= 0) {
      field = text.slice(0, colon);
      value = text.slice(colon + 1);
      if (value[0] === ' ') value = value.slice(1);
    }
    sawField = true;
    if (field === 'data') dataLines.push(value);
    else if (field === 'event') eventType = value;
    else if (field === 'id' && !value.includes('\0')) lastId = value;
    // 'retry' and unknown fields are ignored
  }

  return {
    /** Feed decoded text; returns the events completed by it (possibly none). */
    push(text) {
      buffer += text;
      const out = [];
      let start = 0;
      for (let i = 0; i < buffer.length; i++) {
        const c = buffer[i];
        if (c === '\n' || c === '\r') {
          // A CR at the very end may be the first half of a CRLF: wait for the next piece.
          if (c === '\r' && i === buffer.length - 1) break;
          line(buffer.slice(start, i), out);
          if (c === '\r' && buffer[i + 1] === '\n') i++;
          start = i + 1;
        }
      }
      buffer = buffer.slice(start);
      return out;
    },
    /** End of stream: flush what is left (an unterminated last line and event). */
    end() {
      const out = [];
      if (buffer !== '') {
        const rest = buffer.replace(/\r$/, '');
        buffer = '';
        line(rest, out);
      }
      dispatch(out);
      return out;
    },
  };
}

/** Parse a complete SSE text in one go (convenience over createSseParser). */
export function parseSseChunk(text) {
  const p = createSseParser();
  return [...p.push(text), ...p.end()];
}

/**
 * Async generator of SSE events from a byte stream (a fetch Response body): bytes are decoded
 * with TextDecoder in stream mode, so a UTF-8 character split across reads is kept whole.
 */
export async function* readSseEvents(stream) {
  const reader = stream.getReader();
  const decoder = new TextDecoder('utf-8');
  const parser = createSseParser();
  try {
    for (;;) {
      const { value, done } = await reader.read();
      if (done) break;
      yield* parser.push(decoder.decode(value, { stream: true }));
    }
    yield* parser.push(decoder.decode());
    yield* parser.end();
  } finally {
    reader.releaseLock();
  }
}

// ---------------------------------------------------------------------------------------------
// Chat completion chunks

/** A fresh assistant message being streamed. */
export function newAssistantMessage() {
  return { role: 'assistant', content: '', reasoning: '', finishReason: null, usage: null };
}

/**
 * Interpret one SSE `data` payload of /v1/chat/completions and fold it into `msg` (mutated).
 * Returns 'done' for `[DONE]`, 'chunk' otherwise. Throws an Error (with .apiError) for an
 * OpenAI error envelope sent inside the stream, and for data that is not JSON.
 */
export function applyChunk(msg, data) {
  if (data.trim() === '[DONE]') return 'done';
  let obj;
  try {
    obj = JSON.parse(data);
  } catch {
    throw new Error(`bad stream data (not JSON): ${data.slice(0, 200)}`);
  }
  if (obj && obj.error) {
    const e = new Error(formatApiError(obj.error));
    e.apiError = obj.error;
    throw e;
  }
  if (obj.model && !msg.model) msg.model = obj.model;
  for (const choice of obj.choices || []) {
    if ((choice.index ?? 0) !== 0) continue;
    const d = choice.delta || {};
    if (typeof d.reasoning_content === 'string') msg.reasoning += d.reasoning_content;
    else if (typeof d.reasoning === 'string') msg.reasoning += d.reasoning;
    if (typeof d.content === 'string') msg.content += d.content;
    if (choice.finish_reason) msg.finishReason = choice.finish_reason;
  }
  if (obj.usage) msg.usage = obj.usage;
  return 'chunk';
}

// ---------------------------------------------------------------------------------------------
// Thinking

const OPEN_TAG = '<think>';
const CLOSE_TAG = '</think>';

function partialTagSuffix(text) {
  // Length of the longest suffix of text that is a proper prefix of <think> or </think>.
  for (let n = Math.min(text.length, CLOSE_TAG.length - 1); n > 0; n--) {
    const tail = text.slice(-n);
    if (OPEN_TAG.startsWith(tail) || CLOSE_TAG.startsWith(tail)) return n;
  }
  return 0;
}

/**
 * Split Qwen3-style inline thinking out of a reply's content.
 * - `<think>T</think>A` -> thinking T, answer A (several blocks are joined);
 * - `T</think>A` (the chat template opened the block in the prompt) -> thinking T, answer A;
 * - `<think>T` still open -> thinking T, answer '', open true.
 * With { streaming: true } a trailing partial tag (`<thi`, `</th`) is held back from both parts.
 * Returns { thinking, answer, open } with thinking and answer trimmed.
 */
export function splitThinking(text, { streaming = false } = {}) {
  let s = String(text ?? '');
  if (streaming) s = s.slice(0, s.length - partialTagSuffix(s));
  const thinking = [];
  let answer = '';
  let open = false;

  const firstOpen = s.indexOf(OPEN_TAG);
  const firstClose = s.indexOf(CLOSE_TAG);
  if (firstClose >= 0 && (firstOpen < 0 || firstClose < firstOpen)) {
    thinking.push(s.slice(0, firstClose));
    s = s.slice(firstClose + CLOSE_TAG.length);
  }
  for (;;) {
    const o = s.indexOf(OPEN_TAG);
    if (o < 0) {
      answer += s;
      break;
    }
    answer += s.slice(0, o);
    const rest = s.slice(o + OPEN_TAG.length);
    const c = rest.indexOf(CLOSE_TAG);
    if (c < 0) {
      thinking.push(rest);
      open = true;
      break;
    }
    thinking.push(rest.slice(0, c));
    s = rest.slice(c + CLOSE_TAG.length);
  }
  return {
    thinking: thinking.map((t) => t.trim()).filter(Boolean).join('\n\n'),
    answer: answer.trim(),
    open,
  };
}

/**
 * The parts of an assistant message to show: reasoning_content from the server plus any inline
 * <think> blocks, and the answer. `thinkingOpen` is true while thinking is still streaming.
 */
export function messageParts(msg, { streaming = false } = {}) {
  const split = splitThinking(msg.content, { streaming });
  const reasoning = (msg.reasoning || '').trim();
  const thinking = [reasoning, split.thinking].filter(Boolean).join('\n\n');
  const thinkingOpen = streaming && (split.open || (reasoning !== '' && split.answer === ''));
  return { thinking, answer: split.answer, thinkingOpen };
}

// ---------------------------------------------------------------------------------------------
// Markdown (a safe subset)

const SAFE_URL = /^https?:\/\/[^\s]+$/i;

/** True for an http(s) URL, the only kind rendered as a link. */
export function isSafeUrl(url) {
  return SAFE_URL.test(url);
}

function isPunct(c) {
  return /^[!-/:-@[-`{-~]$/.test(c);
}

function isSpace(c) {
  return c === undefined || /\s/.test(c);
}

function isWordChar(c) {
  return c !== undefined && /[\p{L}\p{N}]/u.test(c);
}

function runLength(s, i, ch) {
  let n = 0;
  while (s[i + n] === ch) n++;
  return n;
}

// Find the closer of an emphasis opened at `from` by `len` copies of `ch`; returns its index or -1.
function findCloser(s, from, ch, len) {
  for (let j = from; j < s.length; j++) {
    const c = s[j];
    if (c === '\\') {
      j++;
      continue;
    }
    if (c === '`') {
      // skip a code span
      const n = runLength(s, j, '`');
      const end = s.indexOf('`'.repeat(n), j + n);
      if (end >= 0) {
        j = end + n - 1;
        continue;
      }
      j += n - 1;
      continue;
    }
    if (c !== ch) continue;
    const n = runLength(s, j, ch);
    if (isSpace(s[j - 1])) {
      j += n - 1;
      continue;
    }
    if (ch === '_' && isWordChar(s[j + n])) {
      j += n - 1;
      continue;
    }
    if (len === 2 && n >= 2) return j + n - 2;
    if (len === 1 && n === 1) return j;
    if (len === 1 && n >= 3) return j + n - 1;
    // len 1 and a run of 2: that is a strong delimiter inside the emphasis; skip it
    j += n - 1;
  }
  return -1;
}

// Index of the ']' matching the '[' at i, or -1.
function matchBracket(s, i) {
  let depth = 0;
  for (let j = i; j < s.length; j++) {
    if (s[j] === '\\') j++;
    else if (s[j] === '[') depth++;
    else if (s[j] === ']' && --depth === 0) return j;
  }
  return -1;
}

// A link destination `(url)` or `(url "title")` starting at s[p] === '(': balanced parentheses
// inside the URL are kept (`(javascript:alert(1))` is one URL). Returns { url, end } or null.
function linkDestination(s, p) {
  if (s[p] !== '(') return null;
  let j = p + 1;
  while (s[j] === ' ') j++;
  let url = '';
  if (s[j] === '<') {
    const close = s.indexOf('>', j);
    if (close < 0 || s.slice(j, close).includes('\n')) return null;
    url = s.slice(j + 1, close);
    j = close + 1;
  } else {
    let depth = 0;
    for (; j < s.length; j++) {
      const c = s[j];
      if (c === '\\' && j + 1 < s.length) {
        url += s[++j];
        continue;
      }
      if (/\s/.test(c)) break;
      if (c === '(') depth++;
      else if (c === ')') {
        if (depth === 0) break;
        depth--;
      }
      url += c;
    }
  }
  const title = /^(?:\s+(?:"[^"]*"|'[^']*'))?\s*\)/.exec(s.slice(j));
  if (!title) return null;
  return { url, end: j + title[0].length };
}

function renderLink(text, url) {
  const inner = renderInline(text);
  if (!isSafeUrl(url)) return inner;
  return `<a href="${escapeHtml(url)}" rel="noopener noreferrer nofollow" target="_blank">${inner}</a>`;
}

/** Render inline Markdown (code spans, emphasis, links, line breaks) to HTML; all text escaped. */
export function renderInline(s) {
  let out = '';
  let i = 0;
  while (i < s.length) {
    const c = s[i];
    if (c === '\\' && i + 1 < s.length && isPunct(s[i + 1])) {
      out += escapeHtml(s[i + 1]);
      i += 2;
      continue;
    }
    if (c === '`') {
      const n = runLength(s, i, '`');
      const end = s.indexOf('`'.repeat(n), i + n);
      if (end >= 0 && s[end + n] !== '`') {
        let code = s.slice(i + n, end).replace(/\n/g, ' ');
        if (/^ .*[^ ].* $/.test(code)) code = code.slice(1, -1);
        out += `<code>${escapeHtml(code)}</code>`;
        i = end + n;
        continue;
      }
      out += escapeHtml('`'.repeat(n));
      i += n;
      continue;
    }
    if (c === '!' && s[i + 1] === '[') {
      // Images are never loaded (the page makes no external requests): show the alt text.
      const close = matchBracket(s, i + 1);
      const dest = close >= 0 && linkDestination(s, close + 1);
      if (dest) {
        out += `<span class="img-alt">[image: ${escapeHtml(s.slice(i + 2, close))}]</span>`;
        i = dest.end;
        continue;
      }
    }
    if (c === '[') {
      const close = matchBracket(s, i);
      const dest = close >= 0 && linkDestination(s, close + 1);
      if (dest) {
        out += renderLink(s.slice(i + 1, close), dest.url);
        i = dest.end;
        continue;
      }
    }
    if (c === '<') {
      const m = /^<(https?:\/\/[^\s<>]+)>/i.exec(s.slice(i));
      if (m) {
        out += renderLink(m[1].replace(/[\\`*_[\]]/g, '\\$&'), m[1]);
        i += m[0].length;
        continue;
      }
    }
    if (c === '*' || c === '_' || c === '~') {
      const n = runLength(s, i, c);
      const canOpen =
        !isSpace(s[i + n]) && !(c === '_' && isWordChar(s[i - 1])) && (c !== '~' || n === 2);
      if (canOpen) {
        const len = c === '~' ? 2 : n >= 2 ? 2 : 1;
        // the opener is the first `len` delimiters of the run; the rest start the content, so
        // the closer is searched for past the whole run (the content is never empty)
        const close = findCloser(s, i + n, c, len);
        if (close > i + len) {
          const inner = s.slice(i + len, close);
          const tag = c === '~' ? 'del' : len === 2 ? 'strong' : 'em';
          out += `<${tag}>${renderInline(inner)}</${tag}>`;
          i = close + len;
          continue;
        }
      }
      out += escapeHtml(s.slice(i, i + n));
      i += n;
      continue;
    }
    if (c === '\n') {
      out += '<br>\n';
      i++;
      continue;
    }
    // plain text up to the next special character
    let j = i + 1;
    while (j < s.length && !'\\`![<*_~\n'.includes(s[j])) j++;
    out += escapeHtml(s.slice(i, j));
    i = j;
  }
  return out;
}

const FENCE = /^( {0,3})(`{3,}|~{3,})\s*([^\s`]*)[^`]*$/;
const HEADING = /^ {0,3}(#{1,6})(?:[ \t]+(.*?))?(?:[ \t]+#+)?[ \t]*$/;
const HR = /^ {0,3}([-*_])(?:[ \t]*\1){2,}[ \t]*$/;
const QUOTE = /^ {0,3}> ?(.*)$/;
const LIST_ITEM = /^( *)([-*+]|\d{1,9}[.)])([ \t]+(.*))?$/;
const TABLE_SEP = /^ *\|? *:?-+:? *(\| *:?-+:? *)*\|? *$/;

function indentOf(line) {
  return line.length - line.trimStart().length;
}

function isBlank(line) {
  return line.trim() === '';
}

function startsBlock(line) {
  return (
    FENCE.test(line) ||
    HEADING.test(line) ||
    HR.test(line) ||
    QUOTE.test(line) ||
    /^ {0,3}([-*+]|1[.)])[ \t]+\S/.test(line)
  );
}

function splitRow(line) {
  let t = line.trim();
  if (t.startsWith('|')) t = t.slice(1);
  if (t.endsWith('|') && !t.endsWith('\\|')) t = t.slice(0, -1);
  return t.split(/(?<!\\)\|/).map((cell) => cell.trim());
}

function safeLang(lang) {
  return lang.replace(/[^A-Za-z0-9_+#.-]/g, '').slice(0, 32);
}

function renderCode(lang, body) {
  const l = safeLang(lang);
  const label = l ? `<span class="code-lang">${escapeHtml(l)}</span>` : '';
  const cls = l ? ` class="language-${escapeHtml(l)}"` : '';
  return (
    `<div class="code-block"><div class="code-head">${label}` +
    `<button type="button" class="copy-code">Copy</button></div>` +
    `<pre><code${cls}>${escapeHtml(body)}</code></pre></div>\n`
  );
}

function renderBlocks(lines, tight) {
  let out = '';
  let i = 0;
  while (i < lines.length) {
    const line = lines[i];
    if (isBlank(line)) {
      i++;
      continue;
    }

    // fenced code block (an unclosed fence runs to the end, as while streaming)
    let m = FENCE.exec(line);
    if (m) {
      const [, indent, fence, lang] = m;
      const body = [];
      i++;
      while (i < lines.length) {
        const l = lines[i];
        const t = l.trim();
        if (indentOf(l) <= 3 && t[0] === fence[0] && /^(`+|~+)$/.test(t) && t.length >= fence.length) {
          i++;
          break;
        }
        body.push(l.slice(Math.min(indent.length, indentOf(l))));
        i++;
      }
      out += renderCode(lang, body.join('\n'));
      continue;
    }

    m = HEADING.exec(line);
    if (m) {
      const level = m[1].length;
      out += `<h${level}>${renderInline(m[2] || '')}</h${level}>\n`;
      i++;
      continue;
    }

    if (HR.test(line)) {
      out += '<hr>\n';
      i++;
      continue;
    }

    if (QUOTE.test(line)) {
      const body = [];
      while (i < lines.length && !isBlank(lines[i])) {
        const q = QUOTE.exec(lines[i]);
        if (q) body.push(q[1]);
        else if (startsBlock(lines[i])) break;
        else body.push(lines[i]); // lazy continuation
        i++;
      }
      out += `<blockquote>\n${renderBlocks(body, false)}</blockquote>\n`;
      continue;
    }

    m = LIST_ITEM.exec(line);
    if (m) {
      const r = renderList(lines, i);
      out += r.html;
      i = r.next;
      continue;
    }

    // GFM table: a header row, a separator row, then body rows
    if (line.includes('|') && i + 1 < lines.length && TABLE_SEP.test(lines[i + 1]) && lines[i + 1].includes('-')) {
      const head = splitRow(line);
      const aligns = splitRow(lines[i + 1]).map((c) =>
        c.startsWith(':') && c.endsWith(':') ? 'center' : c.endsWith(':') ? 'right' : c.startsWith(':') ? 'left' : '',
      );
      const cell = (tag, text, k) => {
        const a = aligns[k] ? ` class="align-${aligns[k]}"` : '';
        return `<${tag}${a}>${renderInline(text.replace(/\\\|/g, '|'))}</${tag}>`;
      };
      let html = '<table>\n<thead><tr>' + head.map((h, k) => cell('th', h, k)).join('') + '</tr></thead>\n<tbody>\n';
      i += 2;
      while (i < lines.length && !isBlank(lines[i]) && lines[i].includes('|')) {
        const cells = splitRow(lines[i]);
        html += '<tr>' + head.map((_, k) => cell('td', cells[k] ?? '', k)).join('') + '</tr>\n';
        i++;
      }
      out += html + '</tbody>\n</table>\n';
      continue;
    }

    // paragraph: lines up to a blank line or the start of another block
    const para = [line.trim()];
    i++;
    while (i < lines.length && !isBlank(lines[i]) && !startsBlock(lines[i])) {
      para.push(lines[i].trim());
      i++;
    }
    const html = renderInline(para.join('\n'));
    out += tight ? `${html}\n` : `<p>${html}</p>\n`;
  }
  return out;
}

function renderList(lines, start) {
  const first = LIST_ITEM.exec(lines[start]);
  const baseIndent = first[1].length;
  const ordered = /\d/.test(first[2]);
  const delim = first[2].slice(-1);
  const sameKind = (mm) =>
    mm && mm[1].length <= baseIndent + (ordered ? 2 : 1) && /\d/.test(mm[2]) === ordered &&
    (ordered ? mm[2].slice(-1) === delim : mm[2] === first[2]);
  const items = [];
  let loose = false; // a blank line between items: every item's paragraphs get <p>
  let i = start;
  while (i < lines.length) {
    const mm = LIST_ITEM.exec(lines[i]);
    if (!sameKind(mm)) break;
    const spaces = mm[3] ? mm[3].length - (mm[4] ?? '').length : 1;
    const contentIndent = mm[1].length + mm[2].length + (spaces > 4 ? 1 : spaces);
    const body = [mm[4] ?? ''];
    i++;
    let sawBlank = false;
    while (i < lines.length) {
      const l = lines[i];
      if (isBlank(l)) {
        sawBlank = true;
        body.push('');
        i++;
        continue;
      }
      const ind = indentOf(l);
      if (ind > baseIndent && ind >= Math.min(contentIndent, baseIndent + 2)) {
        body.push(l.slice(Math.min(ind, contentIndent))); // the item's own blocks, nested lists
        sawBlank = false;
        i++;
        continue;
      }
      if (!sawBlank && !startsBlock(l) && !LIST_ITEM.test(l)) {
        body.push(l.trim()); // lazy paragraph continuation
        i++;
        continue;
      }
      break;
    }
    while (body.length > 1 && body[body.length - 1] === '') body.pop();
    if (sawBlank && i < lines.length && sameKind(LIST_ITEM.exec(lines[i]))) loose = true;
    // an item with a blank line before a block that is not a nested list is loose on its own
    const itemLoose = body.some(
      (l, k) => l === '' && k + 1 < body.length && body[k + 1] !== '' && !LIST_ITEM.test(body[k + 1]),
    );
    items.push({ body, itemLoose });
  }
  const startNum = ordered ? parseInt(first[2], 10) : 1;
  const open = ordered ? (startNum !== 1 ? `<ol start="${startNum}">` : '<ol>') : '<ul>';
  const close = ordered ? '</ol>' : '</ul>';
  const html = items
    .map(({ body, itemLoose }) => `<li>${renderBlocks(body, !(loose || itemLoose)).trimEnd()}</li>\n`)
    .join('');
  return { html: `${open}\n${html}${close}\n`, next: i };
}

/**
 * Render Markdown to an HTML string safe to assign to innerHTML: headings, paragraphs, bold,
 * italic, strikethrough, inline code, fenced code blocks (with a language label and a Copy
 * button), lists (nested), block quotes, rules, tables, and http(s) links (rel=noopener). Raw
 * HTML and entities are escaped and show as typed; other link schemes render as plain text;
 * images render as their alt text (nothing is ever fetched).
 */
export function renderMarkdown(text) {
  const lines = String(text ?? '').replace(/\r\n?/g, '\n').replace(/\t/g, '    ').split('\n');
  return renderBlocks(lines, false);
}

// ---------------------------------------------------------------------------------------------
// Errors

/** One readable line from an OpenAI error object {message, type, param, code}. */
export function formatApiError(err) {
  if (typeof err === 'string') return err;
  if (!err || typeof err !== 'object') return 'unknown error';
  const message = typeof err.message === 'string' && err.message ? err.message : 'unknown error';
  const extra = [];
  if (err.type) extra.push(`type: ${err.type}`);
  if (err.param) extra.push(`param: ${err.param}`);
  if (err.code !== undefined && err.code !== null && err.code !== '') extra.push(`code: ${err.code}`);
  return extra.length ? `${message} (${extra.join(', ')})` : message;
}

/**
 * A readable message for a failed HTTP response: the OpenAI error envelope's fields when the
 * body is one, else the start of the body, prefixed with the status.
 */
export function formatHttpError(status, statusText, bodyText) {
  const head = `HTTP ${status}${statusText ? ` ${statusText}` : ''}`;
  const body = String(bodyText ?? '').trim();
  try {
    const obj = JSON.parse(body);
    if (obj && obj.error !== undefined) return `${head}: ${formatApiError(obj.error)}`;
  } catch {
    // not JSON
  }
  if (!body) return head;
  return `${head}: ${body.length > 300 ? `${body.slice(0, 300)}…` : body}`;
}

// ---------------------------------------------------------------------------------------------
// Requests and settings

export const DEFAULT_SETTINGS = Object.freeze({
  temperature: '0.7',
  top_p: '0.8',
  top_k: '20',
  max_tokens: '1024',
  seed: '',
});

function num(value, integer) {
  if (value === undefined || value === null || String(value).trim() === '') return undefined;
  const n = Number(value);
  if (!Number.isFinite(n)) return undefined;
  return integer ? Math.trunc(n) : n;
}

/**
 * The body of POST /v1/chat/completions: the system prompt (when set), the conversation (user
 * messages and assistant answers without their thinking; errored turns left out), streaming
 * with usage, and the sampling settings that are set (temperature 0 means greedy).
 */
export function buildRequest({ model, system, messages, settings = {} }) {
  const msgs = [];
  if (system && system.trim()) msgs.push({ role: 'system', content: system });
  for (const m of messages) {
    if (m.error || (m.role !== 'user' && m.role !== 'assistant')) continue;
    const content = m.role === 'assistant' ? splitThinking(m.content).answer : m.content;
    if (m.role === 'assistant' && content === '') continue;
    msgs.push({ role: m.role, content });
  }
  const body = { model, messages: msgs, stream: true, stream_options: { include_usage: true } };
  const fields = [
    ['temperature', false],
    ['top_p', false],
    ['top_k', true],
    ['max_tokens', true],
    ['seed', true],
  ];
  for (const [name, integer] of fields) {
    const v = num(settings[name], integer);
    if (v !== undefined) body[name] = v;
  }
  return body;
}

/** Request headers; the API key, when given, as `Authorization: Bearer`. */
export function requestHeaders(apiKey, json = true) {
  const h = { Accept: json ? 'text/event-stream' : 'application/json' };
  if (json) h['Content-Type'] = 'application/json';
  if (apiKey && apiKey.trim()) h.Authorization = `Bearer ${apiKey.trim()}`;
  return h;
}

/** Model ids from a GET /v1/models body (OpenAI list shape). */
export function modelIds(body) {
  const data = body && Array.isArray(body.data) ? body.data : [];
  return data.map((m) => (m && typeof m.id === 'string' ? m.id : null)).filter(Boolean);
}

// ---------------------------------------------------------------------------------------------
// Persistence (localStorage; the API key is never stored here)

export const STORAGE_KEY = 'ruda-chat:v1';

/** The saved state from a Storage-like object, or a fresh one when none or unreadable. */
export function loadState(storage) {
  const fresh = { messages: [], system: '', settings: { ...DEFAULT_SETTINGS }, model: '' };
  let raw;
  try {
    raw = storage.getItem(STORAGE_KEY);
  } catch {
    return fresh;
  }
  if (!raw) return fresh;
  try {
    const s = JSON.parse(raw);
    return {
      messages: Array.isArray(s.messages)
        ? s.messages.filter((m) => m && typeof m.role === 'string' && typeof m.content === 'string')
        : [],
      system: typeof s.system === 'string' ? s.system : '',
      settings: { ...DEFAULT_SETTINGS, ...(s.settings && typeof s.settings === 'object' ? s.settings : {}) },
      model: typeof s.model === 'string' ? s.model : '',
    };
  } catch {
    return fresh;
  }
}

/** Save the state (any apiKey field is dropped). Returns false when storage refused. */
export function saveState(storage, state) {
  const { messages, system, settings, model } = state;
  try {
    storage.setItem(STORAGE_KEY, JSON.stringify({ messages, system, settings, model }));
    return true;
  } catch {
    return false;
  }
}
