package chattemplate_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/chattemplate"
	"github.com/kvrouter/kvrouter/internal/testmetrics"
)

// FuzzRender: rendering arbitrary messages, tools and kwargs never panics; it renders
// or returns an error.
func FuzzRender(f *testing.F) {
	tmpl := loadTemplate(f, "qwen3", nil)
	f.Add([]byte(`[{"role":"user","content":"hi"}]`), []byte(``), []byte(`{"enable_thinking":false}`))
	f.Add([]byte(`[{"role":"assistant","content":null,"tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{\"a\":1.0}"}}]}]`),
		[]byte(`[{"type":"function","function":{"name":"f","parameters":{"type":"object"}}}]`), []byte(``))
	f.Add([]byte(`[{"role":"tool","content":[{"type":"text","text":"x"}]},{"role":"user"}]`), []byte(`null`), []byte(`null`))
	f.Fuzz(func(t *testing.T, messages, tools, kwargs []byte) {
		_, _ = tmpl.Render(chattemplate.Input{
			Messages: messages, Tools: tools, ChatTemplateKwargs: kwargs, AddGenerationPrompt: true,
		})
	})
}

func TestRenderErrors(t *testing.T) {
	tmpl := loadTemplate(t, "qwen3", nil)
	tests := []struct {
		name        string
		in          chattemplate.Input
		unsupported string
		badRequest  bool
	}{
		{name: "invalid messages JSON", in: chattemplate.Input{Messages: json.RawMessage(`[{`)}, badRequest: true},
		{name: "message not an object", in: chattemplate.Input{Messages: json.RawMessage(`["hi"]`)}, badRequest: true},
		{name: "content of wrong type", in: chattemplate.Input{Messages: json.RawMessage(`[{"role":"user","content":5}]`)}, badRequest: true},
		{name: "unknown part type", in: chattemplate.Input{Messages: json.RawMessage(`[{"role":"user","content":[{"type":"weird"}]}]`)}, badRequest: true},
		{name: "non-function tool call", in: chattemplate.Input{Messages: json.RawMessage(`[{"role":"assistant","tool_calls":[{"id":"1","type":"custom","custom":{}}]}]`)}, badRequest: true},
		{name: "tool without name", in: chattemplate.Input{Messages: json.RawMessage(`[{"role":"user","content":"x"}]`), Tools: json.RawMessage(`[{"type":"function","function":{}}]`)}, badRequest: true},
		{name: "kwargs not an object", in: chattemplate.Input{Messages: json.RawMessage(`[{"role":"user","content":"x"}]`), ChatTemplateKwargs: json.RawMessage(`[]`)}, badRequest: true},
		{name: "video part", in: chattemplate.Input{Messages: json.RawMessage(`[{"role":"user","content":[{"type":"video_url","video_url":{"url":"v"}}]}]`)}, unsupported: chattemplate.ReasonMediaContent},
		{name: "untyped image part", in: chattemplate.Input{Messages: json.RawMessage(`[{"role":"user","content":[{"image_url":"u"}]}]`)}, unsupported: chattemplate.ReasonMediaContent},
		{name: "kwargs override messages", in: chattemplate.Input{Messages: json.RawMessage(`[{"role":"user","content":"x"}]`), ChatTemplateKwargs: json.RawMessage(`{"messages":[]}`)}, unsupported: chattemplate.ReasonKwargsOverride},
		{name: "kwargs supply a template", in: chattemplate.Input{Messages: json.RawMessage(`[{"role":"user","content":"x"}]`), ChatTemplateKwargs: json.RawMessage(`{"chat_template":"x"}`)}, unsupported: chattemplate.ReasonKwargsOverride},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, err := tmpl.Render(tt.in)
			var unsupported *chattemplate.UnsupportedError
			switch {
			case tt.unsupported != "":
				if !errors.As(err, &unsupported) || unsupported.Reason != tt.unsupported {
					t.Fatalf("want unsupported %s, got %q, %v", tt.unsupported, out, err)
				}
			case tt.badRequest:
				if !errors.Is(err, chattemplate.ErrBadRequest) {
					t.Fatalf("want ErrBadRequest, got %q, %v", out, err)
				}
			}
		})
	}
}

func TestOpenAIContentFormatDetected(t *testing.T) {
	tests := []struct {
		name, src, want string
	}{
		{"loop over content", `{% for message in messages %}{% for part in message['content'] %}{{ part.type }};{% endfor %}{% endfor %}`, "text;"},
		{"loop over content attribute", `{% for m in messages %}{% for p in m.content %}{{ p.text }}{% endfor %}{% endfor %}`, "x"},
		{"string content", `{% for m in messages %}{{ m.content }}{% endfor %}`, "x"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tmpl, err := chattemplate.Compile(tt.src, chattemplate.Options{})
			if err != nil {
				t.Fatal(err)
			}
			got, err := tmpl.Render(chattemplate.Input{Messages: json.RawMessage(`[{"role":"user","content":"x"}]`)})
			if err != nil || got != tt.want {
				t.Fatalf("got %q, %v; want %q", got, err, tt.want)
			}
		})
	}
}

func TestIncludesRefused(t *testing.T) {
	tmpl, err := chattemplate.Compile(`{% include "/etc/passwd" %}`, chattemplate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if r := tmpl.Refusal(); r == nil || !strings.Contains(r.Construct, "include") {
		t.Fatalf("Refusal() = %v, want one naming include", r)
	}
	out, err := tmpl.Render(chattemplate.Input{Messages: json.RawMessage(`[]`)})
	if err == nil || strings.Contains(out, "root") {
		t.Fatalf("an include was served: %q, %v", out, err)
	}
}

func TestParseTokenizerConfig(t *testing.T) {
	cfg := `{"bos_token":{"content":"<s>","lstrip":false},"eos_token":"</s>","pad_token":null,
		"additional_special_tokens":["<a>",{"content":"<b>"}],
		"chat_template":[{"name":"default","template":"D{{ messages|length }}"},{"name":"tool_use","template":"T{{ tools|length }}"}]}`
	c, err := chattemplate.ParseTokenizerConfig([]byte(cfg))
	if err != nil {
		t.Fatal(err)
	}
	if c.SpecialTokens["bos_token"] != "<s>" || c.SpecialTokens["eos_token"] != "</s>" {
		t.Fatalf("special tokens: %v", c.SpecialTokens)
	}
	if _, ok := c.SpecialTokens["pad_token"]; ok {
		t.Fatal("null pad_token must be absent")
	}
	if got := c.SpecialTokens["additional_special_tokens"]; strings.Join(got.([]string), ",") != "<a>,<b>" {
		t.Fatalf("additional: %v", got)
	}
	tmpl, err := chattemplate.CompileConfig(c, chattemplate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	msgs := json.RawMessage(`[{"role":"user","content":"x"}]`)
	for _, tc := range []struct {
		tools json.RawMessage
		want  string
	}{{nil, "D1"}, {json.RawMessage(`null`), "D1"}, {json.RawMessage(`[{"type":"function","function":{"name":"f"}}]`), "T1"}} {
		got, err := tmpl.Render(chattemplate.Input{Messages: msgs, Tools: tc.tools})
		if err != nil || got != tc.want {
			t.Fatalf("tools %s: got %q, %v; want %q", tc.tools, got, err, tc.want)
		}
	}
	if _, err := chattemplate.CompileConfig(&chattemplate.TokenizerConfig{}, chattemplate.Options{}); !errors.Is(err, chattemplate.ErrNoTemplate) {
		t.Fatalf("want ErrNoTemplate, got %v", err)
	}
}

func TestConcurrentRender(t *testing.T) {
	tmpl := loadTemplate(t, "qwen3", nil)
	var inputs []chattemplate.Input
	var wants []string
	for _, c := range readCases(t) {
		in := inputFromBody(t, c.Body)
		out, err := tmpl.Render(in)
		if err != nil {
			continue
		}
		inputs = append(inputs, in)
		wants = append(wants, out)
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := range inputs {
				j := (i + g*7) % len(inputs)
				if got, err := tmpl.Render(inputs[j]); err != nil || got != wants[j] {
					t.Errorf("concurrent render %d differs: %v", j, err)
				}
			}
		})
	}
	wg.Wait()
}

// TestMessageCacheIdentity: renders with the long-message memo equal renders without
// it, on first use and on hits, and concurrent hits do not interfere.
func TestMessageCacheIdentity(t *testing.T) {
	src, err := os.ReadFile(filepath.Join("testdata", "templates", "qwen3.jinja"))
	if err != nil {
		t.Fatal(err)
	}
	cached, err := chattemplate.Compile(string(src), chattemplate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	plain, err := chattemplate.Compile(string(src), chattemplate.Options{MessageCacheBytes: -1})
	if err != nil {
		t.Fatal(err)
	}
	long := strings.Repeat("A shared system prompt with \"quotes\", \\ and\nnewlines. ", 60)
	var inputs []chattemplate.Input
	for i := range 6 {
		msgs := []map[string]any{
			{"role": "system", "content": long},
			{"role": "user", "content": fmt.Sprintf("question %d", i)},
			{"role": "assistant", "content": nil, "tool_calls": []map[string]any{{"id": "1", "type": "function", "function": map[string]any{"name": "f", "arguments": `{"x": 1.0, "pad": "` + strings.Repeat("p", 1200) + `"}`}}}},
			{"role": "tool", "tool_call_id": "1", "content": "ok"},
		}
		raw, _ := json.Marshal(msgs)
		inputs = append(inputs, chattemplate.Input{Messages: raw, AddGenerationPrompt: i%2 == 0})
	}
	want := make([]string, len(inputs))
	for i, in := range inputs {
		if want[i], err = plain.Render(in); err != nil {
			t.Fatal(err)
		}
	}
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for r := range 3 {
				for i := range inputs {
					j := (i + g + r) % len(inputs)
					if got, err := cached.Render(inputs[j]); err != nil || got != want[j] {
						t.Errorf("cached render %d differs: %v", j, err)
						return
					}
				}
			}
		})
	}
	wg.Wait()
}

// TestRefusedTemplate: a template using a construct the engine does not implement
// compiles, names the construct in Refusal, and answers every render it would make with
// UnsupportedError (ReasonTemplateRefused); a refused tool_use template only affects
// requests with tools. An operation refused at render time (a %-format flag) is
// ReasonTemplateConstruct for that request alone.
func TestRefusedTemplate(t *testing.T) {
	const ok = `{% for m in messages %}{{ m.content }}{% endfor %}`
	const wordwrap = `{% for m in messages %}{{ m.content | wordwrap(20) }}{% endfor %}`
	const format = `{% for m in messages %}{{ '%5s' % m.content if m.content == 'pad' else m.content }}{% endfor %}`
	named := func(def, toolUse string) string {
		raw, _ := json.Marshal(map[string]any{"chat_template": []map[string]string{
			{"name": "default", "template": def}, {"name": "tool_use", "template": toolUse},
		}})
		return string(raw)
	}
	hi := json.RawMessage(`[{"role":"user","content":"hi"}]`)
	tools := json.RawMessage(`[{"type":"function","function":{"name":"f"}}]`)
	tests := []struct {
		name, config string
		in           chattemplate.Input
		wantRefusal  string // substring of Refusal(), "" for none
		want         string // render, when wantReason is ""
		wantReason   string
	}{
		{"default refused", `{"chat_template": ` + strconv.Quote(wordwrap) + `}`, chattemplate.Input{Messages: hi}, "filter 'wordwrap'", "", chattemplate.ReasonTemplateRefused},
		{"tool_use refused, no tools", named(ok, wordwrap), chattemplate.Input{Messages: hi}, "tool_use chat template refused: jinja: unsupported: filter 'wordwrap'", "hi", ""},
		{"tool_use refused, tools", named(ok, wordwrap), chattemplate.Input{Messages: hi, Tools: tools}, "tool_use", "", chattemplate.ReasonTemplateRefused},
		{"format flag, other request", `{"chat_template": ` + strconv.Quote(format) + `}`, chattemplate.Input{Messages: hi}, "", "hi", ""},
		{"format flag refused at render", `{"chat_template": ` + strconv.Quote(format) + `}`, chattemplate.Input{Messages: json.RawMessage(`[{"role":"user","content":"pad"}]`)}, "", "", chattemplate.ReasonTemplateConstruct},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg, err := chattemplate.ParseTokenizerConfig([]byte(tt.config))
			if err != nil {
				t.Fatal(err)
			}
			tmpl, err := chattemplate.CompileConfig(cfg, chattemplate.Options{})
			if err != nil {
				t.Fatalf("CompileConfig: %v", err)
			}
			r := tmpl.Refusal()
			switch {
			case tt.wantRefusal == "" && r != nil:
				t.Fatalf("Refusal() = %v, want nil", r)
			case tt.wantRefusal != "" && (r == nil || !strings.Contains(r.Error(), tt.wantRefusal)):
				t.Fatalf("Refusal() = %v, want one naming %q", r, tt.wantRefusal)
			}
			got, err := tmpl.Render(tt.in)
			if tt.wantReason == "" {
				if err != nil || got != tt.want {
					t.Fatalf("Render = %q, %v; want %q", got, err, tt.want)
				}
				return
			}
			var u *chattemplate.UnsupportedError
			if !errors.As(err, &u) || u.Reason != tt.wantReason {
				t.Fatalf("Render = %q, %v; want UnsupportedError %s", got, err, tt.wantReason)
			}
		})
	}
}

// TestSyntaxErrorRefused: a template that does not parse is refused with its line (no
// construct), and its requests are routed by load.
func TestSyntaxErrorRefused(t *testing.T) {
	tmpl, err := chattemplate.Compile("x\n{% if x %}unclosed", chattemplate.Options{})
	if err != nil {
		t.Fatal(err)
	}
	r := tmpl.Refusal()
	if r == nil || r.Construct != "" || !strings.Contains(r.Error(), "line 2") {
		t.Fatalf("Refusal() = %v, want a syntax error at line 2", r)
	}
	_, err = tmpl.Render(chattemplate.Input{Messages: json.RawMessage(`[]`)})
	var u *chattemplate.UnsupportedError
	if !errors.As(err, &u) || u.Reason != chattemplate.ReasonTemplateRefused {
		t.Fatalf("Render: %v, want UnsupportedError %s", err, chattemplate.ReasonTemplateRefused)
	}
}

// TestMessageCacheBudget: the message cache keeps short and long messages alike, never
// accounts for more than its byte budget however many messages pass through it, and
// reports its bytes and lookups; renders stay those of the uncached template.
func TestMessageCacheBudget(t *testing.T) {
	const budget = 64 << 10
	reg := prometheus.NewPedanticRegistry()
	cached := loadTemplateWith(t, "qwen3", chattemplate.Options{MessageCacheBytes: budget, Metrics: chattemplate.NewMetrics(reg), Model: "m"})
	plain := loadTemplateWith(t, "qwen3", chattemplate.Options{MessageCacheBytes: -1})
	metric := func(name string, labels ...string) float64 { return testmetrics.Value(t, reg, name, labels...) }
	var msgs []map[string]string
	for turn := range 40 {
		// Short questions, answers of about 2 KiB: 40 turns are about 100 KiB, more
		// than the budget.
		msgs = append(msgs,
			map[string]string{"role": "user", "content": fmt.Sprintf("question %d", turn)},
			map[string]string{"role": "assistant", "content": fmt.Sprintf("answer %d ", turn) + strings.Repeat("word ", 400)})
		raw, _ := json.Marshal(msgs)
		in := chattemplate.Input{Messages: raw, AddGenerationPrompt: true}
		want, err := plain.Render(in)
		if err != nil {
			t.Fatal(err)
		}
		got, err := cached.Render(in)
		if err != nil || got != want {
			t.Fatalf("turn %d: cached render differs (%v)", turn, err)
		}
		if b := metric("kvrouter_chattemplate_message_cache_bytes"); b <= 0 || b > budget {
			t.Fatalf("turn %d: cache accounts for %v bytes, want (0, %d]", turn, b, budget)
		}
	}
	hits, misses := metric("kvrouter_chattemplate_message_cache_lookups_total", "result", "hit"), metric("kvrouter_chattemplate_message_cache_lookups_total", "result", "miss")
	if hits == 0 || misses < 80 {
		t.Fatalf("hits %v, misses %v: want hits for re-sent history and a miss per new message", hits, misses)
	}
	// The short first question is still cached one turn after it was sent.
	before := metric("kvrouter_chattemplate_message_cache_lookups_total", "result", "hit")
	raw, _ := json.Marshal(msgs[len(msgs)-2:])
	if _, err := cached.Render(chattemplate.Input{Messages: raw}); err != nil {
		t.Fatal(err)
	}
	if got := metric("kvrouter_chattemplate_message_cache_lookups_total", "result", "hit") - before; got != 2 {
		t.Fatalf("re-sent short and long messages: %v hits, want 2", got)
	}
}
