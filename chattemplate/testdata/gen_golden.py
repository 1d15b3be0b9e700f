#!/usr/bin/env python3
"""Regenerate the golden chat-template renders in testdata/golden/.

Renders every case in testdata/cases.jsonl with Python's Jinja2, set up the
way transformers' `_compile_jinja_template` sets it up, after applying the
message preprocessing vLLM applies to a /v1/chat/completions body. The Go test
(golden_test.go) asserts the Go renderer produces byte-identical output.

Needs only jinja2 3.1.x (Debian: apt-get install python3-jinja2) and, for the
models' own templates, `make models`. Run from the repository root:

    python3 chattemplate/testdata/gen_golden.py

Reference points, transcribed by hand (no vLLM or transformers import):
- transformers utils/chat_template_utils.py: _compile_jinja_template
  (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols,
  tojson, raise_exception, strftime_now) and render_jinja_template
  (render(messages=, tools=, documents=, add_generation_prompt=, **kwargs)
  with kwargs = {**special_tokens_map, **chat_template_kwargs}).
- vLLM (main, 2026): ChatCompletionRequest._normalize_messages_before
  (reasoning_content -> reasoning), build_chat_params + merge_kwargs,
  renderers/chat_utils parse_chat_message_content (content None -> "",
  text parts joined with "\\n", empty parts dropped, reasoning copied to
  reasoning_content), _postprocess_messages (tool-call arguments parsed),
  tools passed as ChatCompletionToolsParam.model_dump().
"""

import json
import os
import re
import sys
from datetime import datetime

import jinja2
import jinja2.ext
import jinja2.nodes
import jinja2.sandbox

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
MODELS_DIR = os.environ.get("KVROUTER_MODELS_DIR", os.path.join(ROOT, ".cache", "models"))
# GOLDEN_OUT redirects the output (TestGoldensRebuild compares a fresh run with the
# committed files).
OUT = os.environ.get("GOLDEN_OUT", os.path.join(HERE, "golden"))
# Models whose own chat template (from the tokenizer_config.json `make models`
# fetches) is rendered on the golden conversations (the cases for qwen3/llama3).
MODEL_TEMPLATES = ("deepseek_v3", "gemma3", "gemini", "llama3_1")
SPECIAL_TOKEN_NAMES = ("bos_token", "eos_token", "unk_token", "sep_token",
                       "pad_token", "cls_token", "mask_token")
# vLLM passes content as a list of parts to a template that loops over it (its
# "openai" content format); the Go side detects it with the same pattern.
CONTENT_LOOP = re.compile(r"""for\s+\w+\s+in\s+\w+(?:\.content\b|\[\s*['"]content['"]\s*\])""")
FIXED_NOW = datetime(2026, 7, 4, 9, 5, 3)  # strftime_now clock for goldens


class Unsupported(Exception):
    pass


class BadRequest(Exception):
    pass


class AssistantTracker(jinja2.ext.Extension):
    """transformers' {% generation %} tag, without mask tracking (render as is)."""
    tags = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        call = self.call_method("_generation_support")
        return jinja2.nodes.CallBlock(call, [], [], body).set_lineno(lineno)

    @jinja2.pass_eval_context
    def _generation_support(self, context, caller):
        return caller()


def compile_template(src):
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent,
                          separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return FIXED_NOW.strftime(fmt)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True,
        extensions=[AssistantTracker, jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env.from_string(src)


TEXT_TYPES = ("text", "input_text", "output_text", "refusal", "thinking")
TEXT_KEY = {"text": "text", "input_text": "text", "output_text": "text",
            "refusal": "refusal", "thinking": "thinking"}
MEDIA = ("image_url", "input_image", "image_embeds", "audio_embeds",
         "video_embeds", "prompt_embeds", "image_pil", "audio_url",
         "input_audio", "video_url", "file")


KNOWN_PART_FIELDS = {"type", "text", "image_url", "input_audio", "file", "audio_url",
                     "video_url", "refusal", "image_pil", "uuid", "image_embeds",
                     "audio_embeds", "video_embeds", "data", "thinking", "closed", "name"}


def parse_parts(role, parts, fmt="string"):
    if role == "system":
        out = []
        for p in parts:
            text = p if isinstance(p, str) else (
                p.get("text") if isinstance(p, dict) and p.get("type") == "text" else None)
            if not (isinstance(text, str) and text.startswith("x-anthropic-billing-header")):
                out.append(p)
                continue
            rest = text.partition("\n")[2]
            if not rest:
                continue
            out.append(rest if isinstance(p, str) else {**p, "text": rest})
        parts = out
    openai = fmt == "openai"
    texts = []
    for p in parts:
        if isinstance(p, str):
            res = {"type": "text", "text": p} if openai else p
            if res:
                texts.append(res)
            continue
        if not isinstance(p, dict):
            raise BadRequest("content part is not an object")
        t = p.get("type")
        if isinstance(t, str) and p.get("uuid") is None and t in TEXT_TYPES:
            v = p.get(TEXT_KEY[t])
            if v is None and t in ("text", "refusal"):
                continue
            if openai:
                res = {"type": "text", "text": v}
                res.update({k: x for k, x in p.items() if k not in KNOWN_PART_FIELDS})
            else:
                res = v
            if res:
                texts.append(res)
            continue
        if isinstance(t, str) and p.get("uuid") is None and t == "tool_reference":
            res = {"type": "tool_reference", "name": p.get("name")} if openai else p.get("name")
            if res:
                texts.append(res)
            continue
        if t in MEDIA or any(k in p for k in MEDIA):
            raise Unsupported("media part")
        raise BadRequest("bad content part")
    if openai:
        return texts
    return "\n".join(texts)


def preprocess(messages, fmt="string"):
    conv = []
    for msg in messages:
        msg = dict(msg)
        rc = msg.pop("reasoning_content", None)
        if rc is not None and msg.get("reasoning") is None:
            msg["reasoning"] = rc
        role = msg["role"]
        content = msg.get("content")
        if content is None:
            content = []
        elif isinstance(content, str):
            content = [{"type": "text", "text": content}]
        out = {"role": role, "content": parse_parts(role, content, fmt)}
        if role == "assistant":
            if msg.get("tool_calls") is not None:
                calls = []
                for tc in msg["tool_calls"]:
                    # pydantic's TypedDict validation rebuilds each call in
                    # schema order (id, function{arguments, name}, type).
                    if isinstance(tc, dict):
                        n = {k: tc[k] for k in ("id", "function", "type") if k in tc}
                        if isinstance(n.get("function"), dict):
                            f = n["function"]
                            n["function"] = {k: f[k] for k in ("arguments", "name") if k in f}
                        tc = n
                    calls.append(tc)
                out["tool_calls"] = calls
            if msg.get("reasoning") is not None:
                out["reasoning"] = msg["reasoning"]
                out["reasoning_content"] = msg["reasoning"]
        elif role == "tool":
            if "tool_call_id" in msg:
                out["tool_call_id"] = msg["tool_call_id"]
            c = out["content"]
            if isinstance(c, list):
                if not any(isinstance(i, dict) and i.get("type") != "text" for i in c):
                    texts = [i.get("text", "") for i in c
                             if isinstance(i, dict) and i.get("type") == "text"]
                    out["content"] = "\n".join(texts) if texts else ""
        if isinstance(msg.get("name"), str):
            out["name"] = msg["name"]
        if isinstance(msg.get("task"), str):
            out["task"] = msg["task"]
        if role == "developer":
            out["tools"] = msg.get("tools")
        conv.append(out)
    for m in conv:
        if m["role"] != "assistant" or "tool_calls" not in m:
            continue
        calls = m["tool_calls"]
        if not isinstance(calls, list):
            continue
        if not calls:
            m.pop("tool_calls")
            continue
        for item in calls:
            if not isinstance(item, dict):
                raise BadRequest("tool call not an object")
            fn = item.get("function")
            if item.get("type", "function") != "function" or not isinstance(fn, dict):
                raise BadRequest("tool call not a function")
            c = fn.get("arguments")
            if c:
                if isinstance(c, dict):
                    parsed = c
                else:
                    if isinstance(c, str):
                        try:
                            parsed = json.loads(c)
                        except json.JSONDecodeError:
                            parsed = None
                    else:
                        parsed = c
                    if not isinstance(parsed, dict):
                        parsed = {}
                fn["arguments"] = parsed
            else:
                fn["arguments"] = {}
    return conv


def dump_tools(tools):
    if tools is None:
        return None
    out = []
    for t in tools:
        f = t["function"]
        fd = {"name": f["name"], "description": f.get("description"),
              "parameters": f.get("parameters")}
        if f.get("strict") is not None:
            fd["strict"] = f["strict"]
        dl = f.get("defer_loading")
        if dl is None:
            dl = t.get("defer_loading")
        if dl is not None:
            fd["defer_loading"] = dl
        d = {"type": t.get("type", "function"), "function": fd}
        if t.get("defer_loading") is not None:
            d["defer_loading"] = t["defer_loading"]
        out.append(d)
    return out


def merge_kwargs(defaults, overrides):
    return {**(defaults or {}), **{k: v for k, v in (overrides or {}).items()
                                   if v is not None and v != "auto"}}


CONSUMED = {"conversation", "tools", "chat_template", "add_generation_prompt",
            "continue_final_message", "tokenize", "padding", "truncation",
            "max_length", "return_tensors", "return_dict",
            "return_assistant_tokens_mask", "tokenizer_kwargs", "documents"}


def render(tmpl, special, body, server_defaults=None, fmt="string"):
    if body.get("chat_template") is not None:
        raise Unsupported("request chat_template")
    if body.get("continue_final_message"):
        raise Unsupported("continue_final_message")
    user = body.get("chat_template_kwargs") or {}
    for k in ("chat_template", "tokenize", "messages", "conversation", "tools"):
        if k in user:
            raise Unsupported("chat_template_kwargs." + k)
    extra = {"add_generation_prompt": body.get("add_generation_prompt", True),
             "continue_final_message": False,
             "documents": body.get("documents"),
             "reasoning_effort": body.get("reasoning_effort")}
    if body.get("reasoning_effort") is not None and "enable_thinking" not in user:
        extra["enable_thinking"] = body["reasoning_effort"] != "none"
    kwargs = merge_kwargs(user, extra)
    if server_defaults:
        kwargs = merge_kwargs(server_defaults, kwargs)
    conv = preprocess(body["messages"], fmt)
    tools = dump_tools(body.get("tools"))
    template_kwargs = {**special, **{k: v for k, v in kwargs.items() if k not in CONSUMED}}
    return tmpl.render(messages=conv, tools=tools,
                       documents=kwargs.get("documents"),
                       add_generation_prompt=kwargs["add_generation_prompt"],
                       **template_kwargs)


def token_content(t):
    return t.get("content") if isinstance(t, dict) else t


def model_template(name):
    """The chat template and transformers' special_tokens_map of a fetched model."""
    path = os.path.join(MODELS_DIR, name, "tokenizer_config.json")
    if not os.path.exists(path):
        sys.exit(f"{path} missing: run `make models`")
    cfg = json.load(open(path))
    special = {}
    for k in SPECIAL_TOKEN_NAMES:
        v = token_content(cfg.get(k))
        if v is not None:
            special[k] = v
    extra = [token_content(t) for t in cfg.get("additional_special_tokens") or []]
    if extra:
        special["additional_special_tokens"] = extra
    return cfg["chat_template"], special


def main():
    models = {}
    # Content format per template, as vLLM detects it (a loop over message content
    # means "openai": content stays a list of parts).
    formats = {"openai_content": "openai"}
    for name in ("qwen3", "llama3", "features", "openai_content", "llama31_style"):
        src = open(os.path.join(HERE, "templates", name + ".jinja")).read()
        special_path = os.path.join(HERE, "templates", name + ".special.json")
        special = json.load(open(special_path)) if os.path.exists(special_path) else {}
        models[name] = (compile_template(src), special, formats.get(name, "string"))
    for name in MODEL_TEMPLATES:
        src, special = model_template(name)
        fmt = "openai" if CONTENT_LOOP.search(src) else "string"
        models[name] = (compile_template(src), special, fmt)
    outs = {name: [] for name in models}
    # cases.jsonl is written by hand; fuzz_cases.jsonl by the Go fuzz generator
    # (differential_test.go, TestFuzzCasesCurrent).
    lines = []
    for path in ("cases.jsonl", "fuzz_cases.jsonl"):
        with open(os.path.join(HERE, path)) as f:
            lines.extend(f)
    for line in lines:
        line = line.strip()
        if not line:
            continue
        case = json.loads(line)
        names = case.get("models", ["qwen3", "llama3"])
        if "qwen3" in names or "llama3" in names:
            names = names + list(MODEL_TEMPLATES)
        for name in names:
            tmpl, special, fmt = models[name]
            rec = {"name": case["name"]}
            try:
                rec["rendered"] = render(tmpl, special, case["body"],
                                         case.get("server_defaults"), fmt)
            except Unsupported as e:
                rec["unsupported"] = str(e)
            except jinja2.exceptions.TemplateError as e:
                rec["template_error"] = str(e)
            except BadRequest as e:
                rec["bad_request"] = str(e)
            outs[name].append(rec)
    # Jinja semantics snippets, rendered with fixed variables (see snippets_test.go).
    snippets = json.load(open(os.path.join(HERE, "snippets.json")))
    snip_out = []
    for src in snippets:
        try:
            snip_out.append({"rendered": compile_template(src).render(
                messages=[{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
                tools=None, documents=None, add_generation_prompt=True, bos_token="<s>",
                x=1, y=2, items=["a", "b"], d={"b": 1, "a": 2})})
        except Exception as e:  # noqa: BLE001 - any template error is an outcome
            snip_out.append({"error": str(e)})
    with open(os.path.join(OUT, "snippets.json"), "w") as f:
        json.dump(snip_out, f, ensure_ascii=False, indent=1)
    for name, recs in outs.items():
        with open(os.path.join(OUT, name + ".jsonl"), "w") as f:
            for r in recs:
                f.write(json.dumps(r, ensure_ascii=False) + "\n")
        print(name, len(recs), "renders", file=sys.stderr)


if __name__ == "__main__":
    main()
