package prompt_test

import (
	"bytes"
	"encoding/json"
	"strconv"
	"testing"

	"github.com/kvrouter/kvrouter/internal/cputime"
	"github.com/kvrouter/kvrouter/internal/testtext"
	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/prompt"
	"github.com/kvrouter/kvrouter/tokenizer"
	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

// typicalChat is the reference experiment's request shape: a ~2,000-token shared
// system prompt, a short exchange and a ~340-token unique user turn (tail selects it).
func typicalChat(tail uint64) *openai.Request {
	msgs := []map[string]string{
		{"role": "system", "content": testtext.Prose(1, 2540)},
		{"role": "user", "content": "Summarise the policy in one line."},
		{"role": "assistant", "content": "The router sends each request to the pod that caches most of its prefix."},
		{"role": "user", "content": "Request __N__. " + testtext.Prose(100+tail, 430)},
	}
	raw, _ := json.Marshal(map[string]any{"model": "qwen3", "messages": msgs})
	req, err := prompt.RequestFromBody(raw)
	if err != nil {
		panic(err)
	}
	return req
}

func benchPromptTokens(b *testing.B, o prompt.LoadOptions) {
	bl, err := prompt.LoadDir(testmodels.Dir(b, "qwen3"), o)
	if err != nil {
		b.Fatal(err)
	}
	// Every request gets a unique user turn ("Request <n>. ..."), so only the shared
	// system prompt can come from the tokenizer's segment cache.
	req := typicalChat(0)
	head, tail, _ := bytes.Cut(req.Messages, []byte("__N__"))
	unique := func(n int) *openai.Request {
		r := *req
		r.Messages = append(append(append(make([]byte, 0, len(head)+len(tail)+12), head...), strconv.Itoa(n)...), tail...)
		return &r
	}
	ids, err := bl.PromptTokens(unique(-1))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	start, n := cputime.Process(), 0
	for b.Loop() {
		if _, err := bl.PromptTokens(unique(n)); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.ReportMetric(float64(cputime.Process()-start)/float64(n), "cpu-ns/op")
	b.ReportMetric(float64(len(ids)), "prompt-tokens")
}

// BenchmarkPromptTokensCold: render + tokenize a 2,400-token chat with the tokenizer's
// segment cache and the template's message cache disabled, so every request decodes,
// renders and tokenizes its whole prompt.
func BenchmarkPromptTokensCold(b *testing.B) {
	benchPromptTokens(b, prompt.LoadOptions{Tokenizer: []tokenizer.Option{tokenizer.WithSegmentCache(0, 0, 0)}, MessageCacheSize: -1})
}

// BenchmarkPromptTokensSystemCached: the same requests with the default caches: the
// shared system prompt is converted and tokenized once, each request's unique turn is
// not.
func BenchmarkPromptTokensSystemCached(b *testing.B) {
	benchPromptTokens(b, prompt.LoadOptions{})
}

// BenchmarkLoadQwen3 measures loading the tokenizer and compiling the template.
func BenchmarkLoadQwen3(b *testing.B) {
	dir := testmodels.Dir(b, "qwen3")
	start, n := cputime.Process(), 0
	for b.Loop() {
		if _, err := prompt.LoadDir(dir, prompt.LoadOptions{}); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.ReportMetric(float64(cputime.Process()-start)/float64(n), "cpu-ns/op")
}

// FuzzRequestFromBody: arbitrary bodies never panic the parser or PromptTokens.
func FuzzRequestFromBody(f *testing.F) {
	bl := builder(f, "qwen3", nil)
	for _, s := range []string{
		`{"prompt":"hi"}`, `{"prompt":[1,2]}`, `{"prompt":[[1],[2]]}`, `{"prompt":["a"]}`,
		`{"messages":[{"role":"user","content":"hi"}],"chat_template_kwargs":{"enable_thinking":false}}`,
		`{"messages":[{"role":"assistant","tool_calls":[{"id":"1","type":"function","function":{"name":"f","arguments":"{}"}}]}],"tools":[]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := prompt.RequestFromBody(body)
		if err != nil {
			return
		}
		_, _ = bl.PromptTokens(req)
	})
}

// BenchmarkPromptTokensHuge computes the prompt ids of one ~15 MB chat body (~3.7M
// words of prose, one user turn), parse included, as the router does: "whole" tokenizes
// all of it (maxTokens 0, the router before the limit), "max=131072" stops where a
// 131,072-token KV cache or context ends. cpu-ns/op is the process's CPU time.
func BenchmarkPromptTokensHuge(b *testing.B) {
	bl, err := prompt.LoadDir(testmodels.Dir(b, "qwen3"), prompt.LoadOptions{})
	if err != nil {
		b.Fatal(err)
	}
	raw, _ := json.Marshal(map[string]any{"model": "qwen3", "messages": []map[string]string{
		{"role": "user", "content": testtext.Prose(1, 3_700_000)}}})
	for _, max := range []int{0, 131072} {
		name := "whole"
		if max > 0 {
			name = "max=" + strconv.Itoa(max)
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(raw)))
			b.ReportAllocs()
			var n int
			cpu := cputime.Process()
			for b.Loop() {
				req, err := openai.Parse("/v1/chat/completions", raw)
				if err != nil {
					b.Fatal(err)
				}
				ids, err := bl.AppendPromptTokens(nil, req, max)
				if err != nil {
					b.Fatal(err)
				}
				n = len(ids)
			}
			if end := cputime.Process(); end > cpu && b.N > 0 {
				b.ReportMetric(float64(end-cpu)/float64(b.N), "cpu-ns/op")
			}
			b.ReportMetric(float64(n), "tokens")
		})
	}
}
