// Regenerates prompt/testdata/golden_ids/<model>.jsonl: for every golden chat render
// (chattemplate/testdata/golden/<model>.jsonl, rendered by Python Jinja2 as
// transformers does for vLLM), the token ids HuggingFace tokenizers gives the rendered
// text with add_special_tokens=false, as vLLM tokenizes a chat prompt.
//
//   cd prompt/testdata/gen && npm install && node gen_ids.mjs
//
// Needs `make models` (the tokenizer files in .cache/models).
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import tk from '@anush008/tokenizers';

const here = path.dirname(fileURLToPath(import.meta.url));
const root = path.resolve(here, '../../..');
const models = process.env.KVROUTER_MODELS_DIR || path.join(root, '.cache/models');
const outDir = path.join(here, '..', 'golden_ids');
fs.mkdirSync(outDir, { recursive: true });

// Chat: the byte-level BPE models kvrouter serves whose template chattemplate proves.
for (const name of ['qwen3', 'llama3', 'llama3_1']) {
  const t = tk.Tokenizer.fromString(fs.readFileSync(path.join(models, name, 'tokenizer.json'), 'utf8'));
  const golden = fs.readFileSync(path.join(root, 'chattemplate/testdata/golden', name + '.jsonl'), 'utf8')
    .split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l)).filter((r) => typeof r.rendered === 'string');
  const lines = [];
  for (const r of golden) {
    const [enc] = await t.encodeBatch([r.rendered], { addSpecialTokens: false });
    lines.push(JSON.stringify({ name: r.name, ids: Array.from(enc.getIds()) }));
  }
  fs.writeFileSync(path.join(outDir, name + '.jsonl'), lines.join('\n') + '\n');
  console.log('wrote', name, lines.length);
}

// Completions: the prompt string encoded with add_special_tokens (default true).
const comps = fs.readFileSync(path.join(here, '..', 'completions.jsonl'), 'utf8')
  .split('\n').filter((l) => l.trim()).map((l) => JSON.parse(l));
for (const name of ['qwen3', 'llama3']) {
  const t = tk.Tokenizer.fromString(fs.readFileSync(path.join(models, name, 'tokenizer.json'), 'utf8'));
  const lines = [];
  for (const c of comps) {
    const p = Array.isArray(c.body.prompt) ? c.body.prompt[0] : c.body.prompt;
    const add = c.body.add_special_tokens !== false;
    const [enc] = await t.encodeBatch([p], { addSpecialTokens: add });
    lines.push(JSON.stringify({ name: c.name, ids: Array.from(enc.getIds()) }));
  }
  fs.writeFileSync(path.join(outDir, name + '-completions.jsonl'), lines.join('\n') + '\n');
  console.log('wrote', name, 'completions', lines.length);
}
