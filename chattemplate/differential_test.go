package chattemplate_test

import (
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"github.com/kvrouter/kvrouter/chattemplate"
)

// fuzzPieces are the fragments random message contents are built from: the markers
// the Qwen3 and Llama 3 templates branch on, whitespace they strip, and non-ASCII
// text.
var fuzzPieces = []string{
	"</think>", "<think>", "\n", "\n\n", " ", "<tool_response>", "</tool_response>", "hello",
	"é", "日本語", "😀", "\t", "\"", "\\", "{", "}", "<|im_end|>", "a", "  x  ", "\u2028",
}

type byteSource struct {
	data []byte
	pos  int
}

func (s *byteSource) next() int {
	if s.pos >= len(s.data) {
		return 0
	}
	s.pos++
	return int(s.data[s.pos-1])
}

func (s *byteSource) text() string {
	n := s.next() % 6
	out := ""
	for range n {
		out += fuzzPieces[s.next()%len(fuzzPieces)]
	}
	return out
}

// fuzzConversation builds a request from fuzz bytes: 1-8 messages with random
// roles, contents (string, null or text parts), reasoning, tool calls; optional tools
// and enable_thinking.
func fuzzConversation(data []byte) chattemplate.Input {
	s := &byteSource{data: data}
	var msgs []map[string]any
	n := 1 + s.next()%8
	for range n {
		m := map[string]any{"role": []string{"system", "user", "assistant", "tool", "user"}[s.next()%5]}
		switch s.next() % 5 {
		case 0:
			m["content"] = nil
		case 1:
			m["content"] = []map[string]any{{"type": "text", "text": s.text()}, {"type": "text", "text": s.text()}}
		default:
			m["content"] = s.text()
		}
		if m["role"] == "assistant" {
			if s.next()%3 == 0 {
				m["reasoning_content"] = s.text()
			}
			for i := range s.next() % 3 {
				args := fmt.Sprintf(`{"q": %q, "n": %d, "f": 1.5, "l": [true, null]}`, s.text(), i)
				if s.next()%4 == 0 {
					args = "not json"
				}
				calls, _ := m["tool_calls"].([]map[string]any)
				m["tool_calls"] = append(calls, map[string]any{
					"id": fmt.Sprint(i), "type": "function",
					"function": map[string]any{"name": "fn" + s.text(), "arguments": args},
				})
			}
		}
		if m["role"] == "tool" && s.next()%2 == 0 {
			m["tool_call_id"] = "0"
		}
		msgs = append(msgs, m)
	}
	raw, _ := json.Marshal(msgs)
	in := chattemplate.Input{Messages: raw, AddGenerationPrompt: s.next()%2 == 0}
	if s.next()%3 == 0 {
		in.Tools = json.RawMessage(`[{"type":"function","function":{"name":"get_weather","description":"Weather é","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`)
	}
	switch s.next() % 3 {
	case 0:
		in.ChatTemplateKwargs = json.RawMessage(`{"enable_thinking": false}`)
	case 1:
		in.ChatTemplateKwargs = json.RawMessage(`{"enable_thinking": true}`)
	}
	return in
}

// FuzzNativeVsGonja renders random conversations with the Qwen3 and Llama 3
// templates on both engines and requires the same result: gonja is known to match
// Jinja2 on these templates (every golden render passes on it), so any difference is
// a native-engine bug. Its seed corpus runs as a plain test.
func FuzzNativeVsGonja(f *testing.F) {
	type pair struct{ native, gonja *chattemplate.Template }
	var pairs []pair
	for _, model := range []string{"qwen3", "llama3"} {
		pairs = append(pairs, pair{
			native: loadTemplateEngine(f, model, nil, chattemplate.EngineNative),
			gonja:  loadTemplateEngine(f, model, nil, chattemplate.EngineGonja),
		})
	}
	for _, seed := range [][]byte{
		{}, {3, 2, 2, 3, 1, 0, 5, 2, 2, 0, 1, 3, 7, 9, 1},
		[]byte("assistant turns with </think> and tool calls"),
		{7, 0, 2, 4, 0, 1, 2, 1, 3, 2, 0, 2, 2, 2, 1, 17, 5, 3, 3, 2, 4, 0, 0, 2, 1, 6, 3, 3, 3},
		{5, 3, 4, 2, 1, 4, 3, 4, 2, 19, 1, 3, 3, 2, 5, 6, 7, 8, 1, 2, 0, 1, 0, 0, 1},
		{8, 2, 2, 5, 1, 1, 0, 2, 5, 5, 0, 3, 2, 2, 2, 8, 9, 10, 11, 12, 2, 3, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15},
	} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		in := fuzzConversation(data)
		for _, p := range pairs {
			want, wantErr := p.gonja.Render(in)
			got, err := p.native.Render(in)
			var raised *chattemplate.TemplateError
			if wantErr != nil && !errors.As(wantErr, &raised) && !errors.Is(wantErr, chattemplate.ErrBadRequest) {
				// gonja itself failed (it does on some empty-string method calls, e.g.
				// content "</think>" with Qwen3, where Jinja2 renders): no reference.
				continue
			}
			if (err == nil) != (wantErr == nil) {
				t.Fatalf("native: %q, %v; gonja: %q, %v\nmessages: %s", got, err, want, wantErr, in.Messages)
			}
			if err != nil {
				var a, b *chattemplate.TemplateError
				if errors.As(err, &a) != errors.As(wantErr, &b) || (a != nil && a.Message != b.Message) {
					t.Fatalf("native error %v, gonja error %v", err, wantErr)
				}
				continue
			}
			if got != want {
				t.Fatalf("native and gonja differ\nnative: %q\n gonja: %q\nmessages: %s", got, want, in.Messages)
			}
		}
	})
}
