package chattemplate_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/chattemplate"
	"github.com/kvrouter/kvrouter/internal/testmetrics"
)

// Incremental rendering (the message cache keeps each message's rendered loop
// iterations): these tests render conversations turn by turn, as a client re-sends
// them, and require every render to be the golden (Jinja2) render or the render of a
// template without the cache.

// earlierTurns returns in with its messages cut to the first 1, 2, ... n-1 messages
// (the conversation's earlier turns), each message's raw JSON unchanged.
func earlierTurns(in chattemplate.Input) []chattemplate.Input {
	msgs, ok := rawMessages(in.Messages)
	if !ok {
		return nil
	}
	var out []chattemplate.Input
	for n := 1; n < len(msgs); n++ {
		p := in
		p.Messages = joinMessages(msgs[:n])
		out = append(out, p)
	}
	return out
}

// rawMessages splits a messages array into its elements' raw JSON.
func rawMessages(raw json.RawMessage) ([][]byte, bool) {
	var msgs []json.RawMessage
	if err := json.Unmarshal(raw, &msgs); err != nil {
		return nil, false
	}
	out := make([][]byte, len(msgs))
	for i, m := range msgs {
		out[i] = m
	}
	return out, true
}

func joinMessages(msgs [][]byte) json.RawMessage {
	return append(append([]byte("["), bytes.Join(msgs, []byte(","))...), ']')
}

// provenanceLog checks the provenance of renders (chattemplate.Provenance): it keeps
// the output each iteration id named the first time it was seen, and fails a render
// in which an id names other bytes, or whose offsets do not describe its output.
// Renders defer the bytes of the iterations they replay (Provenance.Deferred), which
// it poisons before filling them back in two steps, from the output's middle then from
// its start: the first must leave every byte past the middle as the whole render has
// it, and the render returned is the filled one (which callers compare with an
// uncached render).
type provenanceLog struct {
	mu       sync.Mutex
	named    map[uint64]string
	covered  int // bytes of output the provenances covered
	deferred int // bytes of output the renders deferred
}

// render renders in with tmpl, checking and logging its provenance.
func (l *provenanceLog) render(t testing.TB, tmpl *chattemplate.Template, in chattemplate.Input) (string, error) {
	t.Helper()
	prov := chattemplate.Provenance{Deferred: true}
	out, err := tmpl.AppendRenderTraced([]byte("dst"), in, &prov)
	if err != nil {
		if len(prov.IDs) != 0 || len(prov.Ends) != 0 || prov.DeferredBytes() != 0 {
			t.Fatalf("a failed render reported a provenance %+v", prov)
		}
		return "", err
	}
	deferred := prov.DeferredBytes()
	prov.Poison(out, 0xff)
	half := (len(out) - len("dst")) / 2
	prov.Fill(out, half)
	late := string(out[len("dst")+half:])
	prov.Fill(out, 0)
	text := string(out[len("dst"):])
	if late != text[half:] || prov.DeferredBytes() != 0 {
		t.Fatalf("filled from %d: %q, then from 0: %q (%d bytes left deferred)", half, late, text, prov.DeferredBytes())
	}
	if len(prov.Ends) != len(prov.IDs) {
		t.Fatalf("provenance with %d ends and %d ids", len(prov.Ends), len(prov.IDs))
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.named == nil {
		l.named = map[uint64]string{}
	}
	prev := prov.Start
	for i, end := range prov.Ends {
		if prev < 0 || end < prev || end > len(text) {
			t.Fatalf("provenance %+v does not describe a %d-byte output", prov, len(text))
		}
		seg := text[prev:end]
		if named, ok := l.named[prov.IDs[i]]; !ok {
			l.named[prov.IDs[i]] = seg
		} else if named != seg {
			t.Fatalf("iteration id %d named %q, now %q in %q", prov.IDs[i], named, seg, text)
		}
		l.covered += end - prev
		prev = end
	}
	l.deferred += deferred
	return text, nil
}

// sameRender fails unless the two outcomes are the same string or both errors.
func sameRender(t testing.TB, what string, got string, gotErr error, want string, wantErr error) {
	t.Helper()
	if got != want || (gotErr == nil) != (wantErr == nil) {
		t.Fatalf("%s: cached render %q (%v), full render %q (%v)", what, got, gotErr, want, wantErr)
	}
}

// TestIncrementalGolden renders every golden conversation turn by turn with one
// cached template per model (so iterations stored for one conversation are offered to
// all the others), checks each earlier turn against the uncached template and the
// last against Jinja2's golden render, and requires iterations to have been reused.
func TestIncrementalGolden(t *testing.T) {
	cases := readCases(t)
	type pair struct {
		cached, plain *chattemplate.Template
		reg           *prometheus.Registry
	}
	pairs := map[string]pair{}
	load := func(t *testing.T, model string, defaults json.RawMessage) pair {
		key := model + "\x00" + string(defaults)
		if p, ok := pairs[key]; ok {
			return p
		}
		reg := prometheus.NewPedanticRegistry()
		opts := chattemplate.Options{DefaultKwargs: defaults, Metrics: chattemplate.NewMetrics(reg), Model: model}
		var p pair
		if slices.Contains(modelTemplates, model) {
			p = pair{cached: compileModelTemplate(t, model, opts), plain: compileModelTemplate(t, model, chattemplate.Options{DefaultKwargs: defaults, MessageCacheBytes: -1}), reg: reg}
		} else {
			p = pair{cached: loadTemplateWith(t, model, opts), plain: loadTemplateWith(t, model, chattemplate.Options{DefaultKwargs: defaults, MessageCacheBytes: -1}), reg: reg}
		}
		pairs[key] = p
		return p
	}
	goldens := map[string]map[string]goldenResult{}
	rendered := map[string]int{}
	var log provenanceLog
	for _, c := range cases {
		for _, model := range c.Models {
			if goldens[model] == nil {
				goldens[model] = readGolden(t, model)
			}
			want := goldens[model][c.Name]
			if want.Rendered == nil {
				continue
			}
			t.Run(model+"/"+c.Name, func(t *testing.T) {
				p := load(t, model, c.ServerDefaults)
				in := inputFromBody(t, c.Body)
				for i, turn := range earlierTurns(in) {
					got, err := log.render(t, p.cached, turn)
					full, fullErr := p.plain.Render(turn)
					sameRender(t, fmt.Sprintf("turn %d", i+1), got, err, full, fullErr)
				}
				for range 2 { // after its earlier turns, then from its own stored iterations
					got, err := log.render(t, p.cached, in)
					if err != nil || got != *want.Rendered {
						t.Fatalf("cached render differs from Jinja2's (%v)\n got: %q\nwant: %q", err, got, *want.Rendered)
					}
				}
				rendered[model]++
			})
		}
	}
	for key, p := range pairs {
		reused := testmetrics.Value(t, p.reg, "kvrouter_chattemplate_render_iterations_total", "result", "reused")
		model, _, _ := strings.Cut(key, "\x00")
		if reused == 0 && rendered[model] > 0 {
			t.Errorf("%s: no iteration reused over %d conversations", model, rendered[model])
		}
	}
	t.Logf("conversations rendered turn by turn, identical to Jinja2: %v; %d bytes described by provenance, %d deferred", rendered, log.covered, log.deferred)
	if log.deferred == 0 {
		t.Error("no render deferred the bytes of an iteration it replayed")
	}
	if log.covered == 0 {
		t.Error("no render reported a provenance")
	}
}

// TestIncrementalFallback: Qwen3 renders an assistant turn after the last user query
// with its reasoning, and without it once a new user message follows; the stored
// iteration must then not be reused (its recorded read of `loop.index0 >
// ns.last_query_index` differs) while the unaffected ones are. A changed system
// prompt, tools and kwargs leave the other messages' iterations reusable.
func TestIncrementalFallback(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	cached := loadTemplateWith(t, "qwen3", chattemplate.Options{Metrics: chattemplate.NewMetrics(reg), Model: "m"})
	plain := loadTemplateWith(t, "qwen3", chattemplate.Options{MessageCacheBytes: -1})
	msg := func(role, content string, extra ...string) string {
		m := map[string]any{"role": role, "content": content}
		for i := 0; i+1 < len(extra); i += 2 {
			m[extra[i]] = extra[i+1]
		}
		raw, _ := json.Marshal(m)
		return string(raw)
	}
	sys, sys2 := msg("system", "You are terse."), msg("system", "You are verbose.")
	q1 := msg("user", "What is 2+2?")
	a1 := msg("assistant", "4", "reasoning_content", "Add two and two.")
	q2 := msg("user", "And 3+3?")
	a2 := msg("assistant", "<think>\nsix\n</think>\n\n6")
	q3 := msg("user", "Thanks.")
	steps := []struct {
		name     string
		msgs     []string
		tools    string
		kwargs   string
		reused   float64 // iterations of the message loop reused
		rendered float64
		contains string // in the render
		excludes string
	}{
		{name: "first turn", msgs: []string{sys, q1, a1}, rendered: 3, contains: "<think>\nAdd two and two.\n</think>"},
		{name: "the last query moves past a1: a1 renders without its reasoning", msgs: []string{sys, q1, a1, q2},
			reused: 2, rendered: 2, excludes: "Add two and two."},
		{name: "next turn", msgs: []string{sys, q1, a1, q2, a2, q3}, reused: 4, rendered: 2},
		{name: "system prompt changed", msgs: []string{sys2, q1, a1, q2, a2, q3}, reused: 5, rendered: 1, contains: "verbose"},
		{name: "tools and enable_thinking", msgs: []string{sys2, q1, a1, q2, a2, q3}, reused: 6, rendered: 1, // the tools loop
			tools:  `[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]`,
			kwargs: `{"enable_thinking": false}`, contains: "<tools>"},
	}
	for _, s := range steps {
		in := chattemplate.Input{Messages: json.RawMessage("[" + strings.Join(s.msgs, ",") + "]"), AddGenerationPrompt: true}
		if s.tools != "" {
			in.Tools = json.RawMessage(s.tools)
		}
		if s.kwargs != "" {
			in.ChatTemplateKwargs = json.RawMessage(s.kwargs)
		}
		reused0 := testmetrics.Value(t, reg, "kvrouter_chattemplate_render_iterations_total", "result", "reused")
		rendered0 := testmetrics.Value(t, reg, "kvrouter_chattemplate_render_iterations_total", "result", "rendered")
		got, err := cached.Render(in)
		want, wantErr := plain.Render(in)
		sameRender(t, s.name, got, err, want, wantErr)
		reused := testmetrics.Value(t, reg, "kvrouter_chattemplate_render_iterations_total", "result", "reused") - reused0
		rendered := testmetrics.Value(t, reg, "kvrouter_chattemplate_render_iterations_total", "result", "rendered") - rendered0
		if reused != s.reused || rendered != s.rendered {
			t.Errorf("%s: %v iterations reused, %v rendered; want %v, %v", s.name, reused, rendered, s.reused, s.rendered)
		}
		if !strings.Contains(got, s.contains) || (s.excludes != "" && strings.Contains(got, s.excludes)) {
			t.Errorf("%s: render %q should contain %q and not %q", s.name, got, s.contains, s.excludes)
		}
	}
}

// FuzzIncrementalRender renders random conversations turn by turn, then again with a
// changed system message and toggled kwargs, with every model template, and requires
// each render to equal the uncached template's.
func FuzzIncrementalRender(f *testing.F) {
	type pair struct{ cached, plain *chattemplate.Template }
	var pairs []pair
	for _, model := range []string{"qwen3", "llama3"} {
		pairs = append(pairs, pair{loadTemplate(f, model, nil), loadTemplateWith(f, model, chattemplate.Options{MessageCacheBytes: -1})})
	}
	for _, model := range modelTemplates {
		pairs = append(pairs, pair{compileModelTemplate(f, model, chattemplate.Options{}), compileModelTemplate(f, model, chattemplate.Options{MessageCacheBytes: -1})})
	}
	f.Add([]byte{}, []byte{1})
	for i := range fuzzCaseSeeds {
		f.Add(fuzzSeed(i), fuzzSeed(i+1))
	}
	var log provenanceLog
	f.Fuzz(func(t *testing.T, data, other []byte) {
		in := inputFromBody(t, fuzzBody(data))
		variant := inputFromBody(t, fuzzBody(other))
		// The second conversation continues the first: its messages after the first's.
		a, okA := rawMessages(in.Messages)
		b, okB := rawMessages(variant.Messages)
		if !okA || !okB {
			return
		}
		long := in
		long.Messages = joinMessages(append(slices.Clip(a), b...))
		changed := long
		changed.ChatTemplateKwargs = variant.ChatTemplateKwargs
		changed.Tools = variant.Tools
		if len(b) > 0 {
			changed.Messages = joinMessages(append(slices.Clone(b[:1]), a[min(1, len(a)):]...))
		}
		for _, p := range pairs {
			for _, turn := range append(earlierTurns(long), long, changed) {
				got, err := log.render(t, p.cached, turn)
				want, wantErr := p.plain.Render(turn)
				sameRender(t, "turn", got, err, want, wantErr)
			}
		}
	})
}

// TestConversationChain: a turn's messages are found by following the chain of
// cached messages its conversation's previous turn left, comparing bytes instead of
// looking each one up. Whatever the chain predicts (another conversation's reply
// after a shared system prompt, an edited or removed message, a repeated message that
// makes the chain a cycle, a message whose JSON is a prefix of the sent one, other
// white space, the other content format, a malformed array), every render equals
// the uncached template's, and every message counts as one lookup.
func TestConversationChain(t *testing.T) {
	reg := prometheus.NewPedanticRegistry()
	cached := loadTemplateWith(t, "qwen3", chattemplate.Options{Metrics: chattemplate.NewMetrics(reg), Model: "m"})
	plain := loadTemplateWith(t, "qwen3", chattemplate.Options{MessageCacheBytes: -1})
	msg := func(role, content string) string {
		raw, _ := json.Marshal(map[string]any{"role": role, "content": content})
		return string(raw)
	}
	sys := msg("system", "Shared system prompt.")
	conv := func(name string, turns int) []string {
		out := []string{sys}
		for i := range turns {
			out = append(out, msg("user", fmt.Sprintf("%s question %d", name, i)), msg("assistant", fmt.Sprintf("%s answer %d", name, i)))
		}
		return out
	}
	a, b := conv("a", 6), conv("b", 6)
	edited := slices.Clone(a)
	edited[5] = msg("user", "a question 2, edited")
	ok := msg("user", "ok")
	steps := []struct {
		name string
		raw  string
	}{
		{"a, first turns", "[" + strings.Join(a[:5], ",") + "]"},
		{"a, next turn", "[" + strings.Join(a[:9], ",") + "]"},
		{"b after the shared system prompt", "[" + strings.Join(b[:9], ",") + "]"},
		{"a again: the system prompt's chain leads to b", "[" + strings.Join(a, ",") + "]"},
		{"a message edited in the middle", "[" + strings.Join(edited, ",") + "]"},
		{"a message removed", "[" + strings.Join(append(slices.Clone(a[:3]), a[4:]...), ",") + "]"},
		{"a repeated message: the chain is a cycle", "[" + strings.Join([]string{sys, ok, ok, ok, ok, ok}, ",") + "]"},
		{"more repeats than the cycle held", "[" + strings.Join([]string{sys, ok, ok, ok, ok, ok, ok, ok, ok}, ",") + "]"},
		{"a cached message's JSON is a prefix of the one sent", "[" + sys + "," + strings.TrimSuffix(a[1], "}") + `,"name":"x"}` + "]"},
		{"white space between messages", "[ \n" + strings.Join(a[:7], " ,\n\t") + " \n]"},
		{"the chain ends inside the array", "[" + strings.Join(a[:9], ",") + "," + msg("user", "new") + "]"},
		{"malformed after chained messages", "[" + strings.Join(a[:5], ",") + ",}"},
		{"trailing bytes after the array", "[" + strings.Join(a[:5], ",") + "]x"},
		{"no separator", "[" + a[0] + a[1] + "]"},
		{"empty", "[]"},
	}
	messages := 0.0
	var log provenanceLog
	for _, s := range steps {
		in := chattemplate.Input{Messages: json.RawMessage(s.raw), AddGenerationPrompt: true}
		before := testmetrics.Value(t, reg, "kvrouter_chattemplate_message_cache_lookups_total", "result", "hit") + testmetrics.Value(t, reg, "kvrouter_chattemplate_message_cache_lookups_total", "result", "miss")
		got, err := log.render(t, cached, in)
		want, wantErr := plain.Render(in)
		sameRender(t, s.name, got, err, want, wantErr)
		if err == nil {
			n, _ := rawMessages(in.Messages)
			after := testmetrics.Value(t, reg, "kvrouter_chattemplate_message_cache_lookups_total", "result", "hit") + testmetrics.Value(t, reg, "kvrouter_chattemplate_message_cache_lookups_total", "result", "miss")
			if after-before != float64(len(n)) {
				t.Errorf("%s: %v lookups counted for %d messages", s.name, after-before, len(n))
			}
			messages += float64(len(n))
		}
	}
	if hits := testmetrics.Value(t, reg, "kvrouter_chattemplate_message_cache_lookups_total", "result", "hit"); hits < messages/2 {
		t.Errorf("%v of %v messages hit the cache", hits, messages)
	}

	// The other content format: a model whose tool_use template loops over content
	// gets the same messages as parts (requests with tools), cached apart from the
	// string form its default template gets, in one message cache.
	read := func(name string) string {
		src, err := os.ReadFile(filepath.Join("testdata", "templates", name+".jinja"))
		if err != nil {
			t.Fatal(err)
		}
		return string(src)
	}
	cfg := &chattemplate.TokenizerConfig{Template: read("qwen3"), ToolUseTemplate: read("openai_content"), SpecialTokens: map[string]any{}}
	mixed, err := chattemplate.CompileConfig(cfg, chattemplate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	mixedPlain, err := chattemplate.CompileConfig(cfg, chattemplate.Options{MessageCacheBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	tools := json.RawMessage(`[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]`)
	for i := range 6 {
		in := chattemplate.Input{Messages: json.RawMessage("[" + strings.Join(a[:3+i], ",") + "]"), AddGenerationPrompt: true}
		if i%2 == 1 {
			in.Tools = tools
		}
		got, err := log.render(t, mixed, in)
		want, wantErr := mixedPlain.Render(in)
		sameRender(t, fmt.Sprintf("mixed formats, turn %d", i), got, err, want, wantErr)
	}
}
