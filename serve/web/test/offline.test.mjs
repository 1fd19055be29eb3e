// The served files must not reach the network: no external URL of any kind.
import { test } from 'node:test';
import assert from 'node:assert/strict';
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const dir = fileURLToPath(new URL('..', import.meta.url));
const SERVED = ['index.html', 'app.js', 'chat.js', 'style.css'];

test('served files contain no external URL, protocol-relative URL, @import or url()', () => {
  for (const f of SERVED) {
    const text = readFileSync(dir + f, 'utf8');
    assert.doesNotMatch(text, /\b(https?|wss?|ftp):\/\//i, f);
    assert.doesNotMatch(text, /(src|href|action)\s*=\s*["']?\/\//i, f);
    assert.doesNotMatch(text, /@import|\burl\(\s*["']?[a-z/]/i, f);
  }
});

test('index.html loads only its own files, by relative URL, under a strict CSP', () => {
  const html = readFileSync(dir + 'index.html', 'utf8');
  const refs = [...html.matchAll(/\b(?:src|href)="([^"]*)"/g)].map((m) => m[1]);
  assert.deepEqual(refs.sort(), ['app.js', 'data:,', 'style.css']);
  assert.match(html, /Content-Security-Policy" content="default-src 'self'; script-src 'self'/);
  assert.doesNotMatch(html, /<script>|\son[a-z]+=/i, 'no inline script or handler');
});

test('app.js imports only ./chat.js and never assigns unescaped text as HTML', () => {
  const js = readFileSync(dir + 'app.js', 'utf8');
  assert.deepEqual([...js.matchAll(/from '([^']+)'/g)].map((m) => m[1]), ['./chat.js']);
  const html = [...js.matchAll(/\.(innerHTML|outerHTML)\s*=\s*([^;]+);/g)].map((m) => m[2].trim());
  assert.deepEqual(html, ['renderMarkdown(parts.answer)']);
  assert.doesNotMatch(js, /insertAdjacentHTML|document\.write|eval\(|new Function/);
});
