import { test } from 'node:test';
import assert from 'node:assert/strict';
import { escapeHtml, isSafeUrl, renderInline, renderMarkdown } from '../chat.js';

const md = (s) => renderMarkdown(s).trim();

// Every tag in the output is one renderMarkdown writes, with only its own attributes: the
// proof that nothing from the input became markup.
const TAGS = new Set([
  'p', 'br', 'h1', 'h2', 'h3', 'h4', 'h5', 'h6', 'strong', 'em', 'del', 'code', 'pre', 'ul', 'ol',
  'li', 'blockquote', 'hr', 'a', 'table', 'thead', 'tbody', 'tr', 'th', 'td', 'div', 'span', 'button',
]);
function assertSafe(html) {
  for (const m of html.matchAll(/<\/?([^\s>/]+)([^>]*)>/g)) {
    const [, tag, attrs] = m;
    assert.ok(TAGS.has(tag), `unexpected tag <${tag}> in ${html}`);
    for (const a of attrs.matchAll(/\s*([^\s=]+)(?:="([^"]*)")?/g)) {
      const [, name, value = ''] = a;
      if (!name) continue;
      assert.ok(['class', 'href', 'rel', 'target', 'start', 'type'].includes(name), `attribute ${name} in ${html}`);
      if (name === 'href') assert.match(value, /^https?:\/\//, html);
      if (name === 'start') assert.match(value, /^\d+$/);
      assert.doesNotMatch(value, /[<>"]/);
    }
  }
  assert.doesNotMatch(html, /<(script|img|iframe|svg|object|style)/i);
}

// Every element renderMarkdown opens is closed, in order.
function assertBalanced(html, input) {
  const stack = [];
  for (const m of html.matchAll(/<(\/?)([a-z0-9]+)[^>]*>/g)) {
    if (m[2] === 'br' || m[2] === 'hr') continue;
    if (m[1]) assert.equal(stack.pop(), m[2], `${JSON.stringify(input)} -> ${html}`);
    else stack.push(m[2]);
  }
  assert.deepEqual(stack, [], `${JSON.stringify(input)} -> ${html}`);
}

test('escapeHtml escapes the five HTML characters', () => {
  assert.equal(escapeHtml(`<a href="x" title='y'>&amp;</a>`), '&lt;a href=&quot;x&quot; title=&#39;y&#39;&gt;&amp;amp;&lt;/a&gt;');
  assert.equal(escapeHtml(42), '42');
});

test('headings, paragraphs, line breaks', () => {
  assert.equal(md('# Title'), '<h1>Title</h1>');
  assert.equal(md('### Three ###'), '<h3>Three</h3>');
  assert.equal(md('#nospace'), '<p>#nospace</p>');
  assert.equal(md('one\ntwo\n\nthree'), '<p>one<br>\ntwo</p>\n<p>three</p>');
  assert.equal(md('para\n# head'), '<p>para</p>\n<h1>head</h1>');
  assert.equal(md('a\r\nb'), '<p>a<br>\nb</p>');
});

test('bold, italic, nested emphasis, strikethrough', () => {
  assert.equal(md('**b** *i* __b__ _i_ ~~s~~'), '<p><strong>b</strong> <em>i</em> <strong>b</strong> <em>i</em> <del>s</del></p>');
  assert.equal(md('**bold *it* bold**'), '<p><strong>bold <em>it</em> bold</strong></p>');
  assert.equal(md('*it **bold** it*'), '<p><em>it <strong>bold</strong> it</em></p>');
  assert.equal(md('***both***'), '<p><strong><em>both</em></strong></p>');
  assert.equal(md('**bold *italic***'), '<p><strong>bold <em>italic</em></strong></p>');
  assert.equal(md('snake_case_name'), '<p>snake_case_name</p>');
  assert.equal(md('2 * 3 * 4'), '<p>2 * 3 * 4</p>');
  assert.equal(md('**unclosed'), '<p>**unclosed</p>');
  assert.equal(md('\\*not em\\*'), '<p>*not em*</p>');
});

test('emphasis markup is always well nested', () => {
  for (const s of ['*a **b* c**', '**a *b** c*', '***a* b**', '_a *b_ c*', '**a `**` b**', '*~~a*~~']) {
    const html = md(s);
    const stack = [];
    for (const m of html.matchAll(/<(\/?)(strong|em|del|code)>/g)) {
      if (m[1]) assert.equal(stack.pop(), m[2], `${s} -> ${html}`);
      else stack.push(m[2]);
    }
    assert.deepEqual(stack, [], `${s} -> ${html}`);
  }
});

test('inline code is escaped and not parsed further', () => {
  assert.equal(md('use `a<b> && *c*`'), '<p>use <code>a&lt;b&gt; &amp;&amp; *c*</code></p>');
  assert.equal(md('`` a`b ``'), '<p><code>a`b</code></p>');
  assert.equal(md('`unclosed'), '<p>`unclosed</p>');
});

test('fenced code blocks with a language label; the language is sanitized', () => {
  const html = md('```rust\nfn main() { println!("<hi>"); }\n```');
  assert.match(html, /<span class="code-lang">rust<\/span>/);
  assert.match(html, /<pre><code class="language-rust">fn main\(\) \{ println!\(&quot;&lt;hi&gt;&quot;\); \}<\/code><\/pre>/);
  const evil = md('```"><img src=x onerror=alert(1)>\nx\n```');
  assertSafe(evil);
  assert.doesNotMatch(md('~~~\nplain\n~~~'), /code-lang/);
  assert.match(md('````\n```\ninner\n```\n````'), /<code>```\ninner\n```<\/code>/);
});

test('an unclosed code fence runs to the end (as while streaming)', () => {
  const html = md('text\n\n```python\ndef f():\n    return 1 # **not bold**');
  assert.match(html, /<p>text<\/p>/);
  assert.match(html, /<code class="language-python">def f\(\):\n    return 1 # \*\*not bold\*\*<\/code>/);
  assert.doesNotMatch(html, /<strong>/);
});

test('lists: unordered, ordered with start, nested, loose', () => {
  assert.equal(md('- a\n- b'), '<ul>\n<li>a</li>\n<li>b</li>\n</ul>');
  assert.equal(md('* a\n* **b**'), '<ul>\n<li>a</li>\n<li><strong>b</strong></li>\n</ul>');
  assert.equal(md('3. c\n4. d'), '<ol start="3">\n<li>c</li>\n<li>d</li>\n</ol>');
  assert.equal(md('- a\n  - b\n    - c\n- d'), '<ul>\n<li>a\n<ul>\n<li>b\n<ul>\n<li>c</li>\n</ul></li>\n</ul></li>\n<li>d</li>\n</ul>');
  assert.equal(md('1. one\n   - sub\n2. two'), '<ol>\n<li>one\n<ul>\n<li>sub</li>\n</ul></li>\n<li>two</li>\n</ol>');
  assert.equal(md('- a\n\n- b'), '<ul>\n<li><p>a</p></li>\n<li><p>b</p></li>\n</ul>');
  assert.equal(md('- a\ncontinued'), '<ul>\n<li>a<br>\ncontinued</li>\n</ul>');
  assert.equal(md('intro:\n- x'), '<p>intro:</p>\n<ul>\n<li>x</li>\n</ul>');
  assert.match(md('- item\n\n  ```js\n  code()\n  ```'), /<li><p>item<\/p>\n<div class="code-block">.*<code class="language-js">code\(\)<\/code>/s);
});

test('blockquotes, rules, tables', () => {
  assert.equal(md('> quoted *text*'), '<blockquote>\n<p>quoted <em>text</em></p>\n</blockquote>');
  assert.equal(md('a\n\n---\n\nb'), '<p>a</p>\n<hr>\n<p>b</p>');
  const t = md('| a | b |\n|:--|--:|\n| <x> | **y** |');
  assert.match(t, /<th class="align-left">a<\/th><th class="align-right">b<\/th>/);
  assert.match(t, /<td class="align-left">&lt;x&gt;<\/td><td class="align-right"><strong>y<\/strong><\/td>/);
});

test('raw HTML is escaped: script, img onerror, iframes, comments', () => {
  const cases = [
    '<script>alert(1)</script>',
    '<img src=x onerror="alert(1)">',
    'text <img src=x onerror=alert(1)> text',
    '<iframe src="javascript:alert(1)"></iframe>',
    '<!-- comment --><b>bold?</b>',
    '<svg onload=alert(1)>',
    '# <script>x</script>\n- <img src=x onerror=y>\n> <b onclick=z>',
    '**<script>**',
    '[<img src=x onerror=alert(1)>](https://ok.example)',
    '| <script> | b |\n|---|---|\n| c | d |',
  ];
  for (const c of cases) {
    const html = md(c);
    assertSafe(html);
    assert.match(html, /&lt;/, c);
  }
  assert.equal(md('<script>alert(1)</script>'), '<p>&lt;script&gt;alert(1)&lt;/script&gt;</p>');
});

test('HTML entities are shown as typed, never decoded into markup', () => {
  assert.equal(md('&lt;script&gt;'), '<p>&amp;lt;script&amp;gt;</p>');
  assert.equal(md('&amp; &#60;b&#62; &nbsp;'), '<p>&amp;amp; &amp;#60;b&amp;#62; &amp;nbsp;</p>');
  assert.equal(md('Tom & Jerry < 3'), '<p>Tom &amp; Jerry &lt; 3</p>');
});

test('links: http(s) only, rel=noopener, other schemes are text', () => {
  assert.equal(
    md('[RUDA](https://example.com/a?b=1&c="2")'),
    '<p><a href="https://example.com/a?b=1&amp;c=&quot;2&quot;" rel="noopener noreferrer nofollow" target="_blank">RUDA</a></p>',
  );
  assert.equal(md('[x](javascript:alert(1))'), '<p>x</p>');
  assert.equal(md('[x](JavaScript:alert(1))'), '<p>x</p>');
  assert.equal(md('[x](data:text/html,<script>alert(1)</script>)'), '<p>x</p>');
  assert.equal(md('[x](vbscript:msgbox)'), '<p>x</p>');
  assert.equal(md('[x](//evil.example)'), '<p>x</p>');
  assert.equal(md('[x]( javascript:alert(1) )'), '<p>x</p>');
  assert.match(md('[w](https://en.wikipedia.org/wiki/Rust_(language))'), /href="https:\/\/en\.wikipedia\.org\/wiki\/Rust_\(language\)"/);
  assert.match(md('<https://example.com>'), /<a href="https:\/\/example\.com" [^>]*>https:\/\/example\.com<\/a>/);
  assert.equal(md('<javascript:alert(1)>'), '<p>&lt;javascript:alert(1)&gt;</p>');
  assert.equal(md('[x](https://a "title")'), '<p><a href="https://a" rel="noopener noreferrer nofollow" target="_blank">x</a></p>');
  assert.equal(md('[not a link]'), '<p>[not a link]</p>');
  assert.ok(isSafeUrl('http://x') && isSafeUrl('HTTPS://x') && !isSafeUrl('javascript:x') && !isSafeUrl('https://a b'));
});

test('images are never loaded: their alt text shows', () => {
  const html = md('![a cat](https://example.com/cat.png)');
  assert.equal(html, '<p><span class="img-alt">[image: a cat]</span></p>');
  assertSafe(md('![<img src=x onerror=1>](https://x/y.png)'));
});

test('fuzz: random markdown-ish input always gives safe, balanced output', () => {
  const alphabet = ['*', '_', '`', '~', '[', ']', '(', ')', '<', '>', '"', "'", '&', '#', '-', '1.', '|', '\n', '\n\n', ' ', 'a', 'b', 'https://x', 'javascript:', '<script>', 'onerror=', '\\', '```', '> '];
  let seed = 12345;
  const rand = (n) => {
    seed = (seed * 1103515245 + 12345) & 0x7fffffff;
    return seed % n;
  };
  for (let k = 0; k < 2000; k++) {
    let s = '';
    const len = 1 + rand(40);
    for (let j = 0; j < len; j++) s += alphabet[rand(alphabet.length)];
    const html = renderMarkdown(s);
    assertSafe(html);
    assertBalanced(html, s);
    const inline = renderInline(s);
    assertSafe(inline);
    assertBalanced(inline, s);
  }
});
