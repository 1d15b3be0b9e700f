package chattemplate_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/chattemplate"
)

// fuzzPieces are the fragments random message contents are built from: the markers
// the Qwen3 and Llama 3 templates branch on, whitespace they strip, and non-ASCII
// text.
var fuzzPieces = []string{
	"</think>", "<think>", "\n", "\n\n", " ", "<tool_response>", "</tool_response>", "hello",
	"é", "日本語", "😀", "\t", "\"", "\\", "{", "}", "<|im_end|>", "a", "  x  ", "\u2028",
	strings.Repeat("a long message the message cache keeps. ", 30), // 1,200 bytes
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

// fuzzBody builds a chat completions body from fuzz bytes: 1-8 messages with random
// roles, contents (string, null or text parts), reasoning, tool calls; optional tools,
// enable_thinking and add_generation_prompt.
func fuzzBody(data []byte) json.RawMessage {
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
	body := map[string]any{"messages": msgs, "add_generation_prompt": s.next()%2 == 0}
	if s.next()%3 == 0 {
		body["tools"] = json.RawMessage(`[{"type":"function","function":{"name":"get_weather","description":"Weather é","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`)
	}
	switch s.next() % 3 {
	case 0:
		body["chat_template_kwargs"] = map[string]any{"enable_thinking": false}
	case 1:
		body["chat_template_kwargs"] = map[string]any{"enable_thinking": true}
	}
	raw, _ := json.Marshal(body)
	return raw
}

// fuzzCaseSeeds is how many generated conversations testdata/fuzz_cases.jsonl holds;
// seed i is sha256("fuzz-<i>") followed by sha256("fuzz-<i>-2").
const fuzzCaseSeeds = 120

func fuzzSeed(i int) []byte {
	a := sha256.Sum256([]byte(fmt.Sprintf("fuzz-%d", i)))
	b := sha256.Sum256([]byte(fmt.Sprintf("fuzz-%d-2", i)))
	return append(a[:], b[:]...)
}

var updateFuzzCases = flag.Bool("update-fuzz-cases", false, "rewrite testdata/fuzz_cases.jsonl (then run gen_golden.py)")

// TestFuzzCasesCurrent: testdata/fuzz_cases.jsonl, the generated conversations
// gen_golden.py renders with Jinja2 (and TestGolden compares), is what fuzzBody
// makes of the seeds, so a change to the generator gets its goldens regenerated.
func TestFuzzCasesCurrent(t *testing.T) {
	var b bytes.Buffer
	for i := range fuzzCaseSeeds {
		line, _ := json.Marshal(map[string]any{"name": fmt.Sprintf("fuzz_%03d", i), "body": fuzzBody(fuzzSeed(i))})
		b.Write(append(line, '\n'))
	}
	path := filepath.Join("testdata", "fuzz_cases.jsonl")
	if *updateFuzzCases {
		if err := os.WriteFile(path, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	got, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(got, b.Bytes()) {
		t.Fatalf("%s is stale: go test -run TestFuzzCasesCurrent -update-fuzz-cases ./chattemplate, then gen_golden.py", path)
	}
}

// FuzzConversations renders random conversations with the Qwen3 and Llama 3 templates.
// Jinja2 is the reference for the
// conversations this generator makes from fixed seeds (testdata/fuzz_cases.jsonl,
// compared in TestGolden); for any other input the fuzzer requires what needs no
// reference: no panic, an error only of a documented kind, and the same result with
// and without the long-message cache. Its seed corpus runs as a plain test.
func FuzzConversations(f *testing.F) {
	type pair struct{ cached, uncached *chattemplate.Template }
	var pairs []pair
	for _, model := range []string{"qwen3", "llama3"} {
		pairs = append(pairs, pair{
			cached:   loadTemplate(f, model, nil),
			uncached: loadTemplateWith(f, model, chattemplate.Options{MessageCacheSize: -1}),
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
	for i := range fuzzCaseSeeds {
		f.Add(fuzzSeed(i))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		in := inputFromBody(t, fuzzBody(data))
		for _, p := range pairs {
			got, err := p.uncached.Render(in)
			for range 2 { // the first render fills the cache, the second reads it
				cached, errCached := p.cached.Render(in)
				if cached != got || (err == nil) != (errCached == nil) {
					t.Fatalf("message cache changes the render: %q, %v vs %q, %v", cached, errCached, got, err)
				}
			}
			var raised *chattemplate.TemplateError
			var unsupported *chattemplate.UnsupportedError
			if err != nil && !errors.As(err, &raised) && !errors.Is(err, chattemplate.ErrBadRequest) && !errors.As(err, &unsupported) {
				t.Fatalf("untyped error: %v\nmessages: %s", err, in.Messages)
			}
		}
	})
}
