// Package chattemplate renders a model's Jinja chat template exactly as vLLM does: the
// request's messages, tools and chat_template_kwargs go through vLLM's preprocessing
// (content None -> "", text parts joined with "\n", tool-call arguments parsed into
// objects, reasoning copied to reasoning_content, tools as their pydantic model dump,
// kwargs merged as vLLM merges them), then the template is rendered with the
// environment transformers builds for apply_chat_template (Jinja2's immutable
// sandbox with trim_blocks, lstrip_blocks and loop controls; transformers' tojson,
// raise_exception and strftime_now).
//
// One engine renders templates: internal/jinja, the subset of Jinja2 chat templates
// use, exact to Python's Jinja2. A template using a construct outside that subset is
// refused, never rendered differently: Template.Refusal names the construct and every
// request it would render returns *UnsupportedError (ReasonTemplateRefused), as does a
// single render reaching an operation the engine does not implement
// (ReasonTemplateConstruct), so callers route those requests by load.
//
// Values come from the raw request JSON, so objects keep their request key order and
// numbers keep Python's int/float distinction; tojson prints them as Python's
// json.dumps(ensure_ascii=False) does (1.0, 1e-07, -0.0, 1e+16, ints of any size).
//
// Request shapes that cannot be reproduced byte for byte (multimodal parts, a
// request-supplied template, continue_final_message) return *UnsupportedError, so
// callers can route them by load. Templates that loop over message content get content
// as a list of parts, as vLLM's "openai" content format does.
//
// With the message cache on, a conversation's next turn renders incrementally: each
// iteration of the template's message loop is reused from the previous turn when every
// value it read from outside itself is unchanged (internal/jinja's memo.go), so only
// new messages, and earlier ones whose rendering depends on them, are executed.
//
// Concurrency: a *Template's compiled form is immutable after Compile and its caches
// are locked; Render and AppendRender are safe for concurrent use. Nothing in the
// package logs or starts goroutines.
package chattemplate
