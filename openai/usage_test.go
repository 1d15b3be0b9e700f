package openai_test

import (
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/openai"
)

const sseWithUsage = "data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"Hi\"}}],\"usage\":null}\n\n" +
	"data: {\"id\":\"c1\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\" there\"},\"finish_reason\":\"stop\"}]}\n\n" +
	"data: {\"id\":\"c1\",\"choices\":[],\"usage\":{\"prompt_tokens\":2400,\"total_tokens\":2410,\"completion_tokens\":10," +
	"\"prompt_tokens_details\":{\"cached_tokens\":2384}}}\n\n" +
	"data: [DONE]\n\n"

func TestUsageReader(t *testing.T) {
	tests := []struct {
		name   string
		body   string
		want   openai.Usage
		wantOK bool
	}{
		{"sse with usage", sseWithUsage, openai.Usage{PromptTokens: 2400, CompletionTokens: 10, CachedTokens: 2384, HasCached: true}, true},
		{"sse crlf", strings.ReplaceAll(sseWithUsage, "\n", "\r\n"), openai.Usage{PromptTokens: 2400, CompletionTokens: 10, CachedTokens: 2384, HasCached: true}, true},
		{"sse no usage", "data: {\"choices\":[]}\n\ndata: [DONE]\n\n", openai.Usage{}, false},
		{"sse usage without details", "data: {\"usage\":{\"prompt_tokens\":7}}\n\n", openai.Usage{PromptTokens: 7}, true},
		{"sse last event unterminated", "data: {\"usage\":{\"prompt_tokens\":7}}", openai.Usage{PromptTokens: 7}, true},
		{"sse event and comment fields", ": ping\nevent: message\nid: 3\ndata: {\"usage\":{\"prompt_tokens\":5,\"prompt_tokens_details\":{\"cached_tokens\":0}}}\n\n",
			openai.Usage{PromptTokens: 5, CachedTokens: 0, HasCached: true}, true},
		{"sse multi-line data", "data: {\"usage\":\ndata: {\"prompt_tokens\":9}}\n\n", openai.Usage{PromptTokens: 9}, true},
		{"json body", "  {\"id\":\"x\",\"choices\":[{\"text\":\"a\"}],\"usage\":{\"prompt_tokens\":33,\"prompt_tokens_details\":{\"cached_tokens\":16}}}",
			openai.Usage{PromptTokens: 33, CachedTokens: 16, HasCached: true}, true},
		{"json body without usage", `{"object":"list","data":[]}`, openai.Usage{}, false},
		{"json error body", `{"error":{"message":"bad"}}`, openai.Usage{}, false},
		{"garbage", "\x00\xff not sse", openai.Usage{}, false},
		{"empty", "", openai.Usage{}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			// Every split into two chunks, and one byte at a time, gives the same answer.
			splits := [][]string{{tc.body}}
			for i := 1; i < len(tc.body); i++ {
				splits = append(splits, []string{tc.body[:i], tc.body[i:]})
			}
			bytewise := make([]string, len(tc.body))
			for i := range tc.body {
				bytewise[i] = tc.body[i : i+1]
			}
			splits = append(splits, bytewise)
			for _, chunks := range splits {
				var u openai.UsageReader
				for _, c := range chunks {
					if n, err := u.Write([]byte(c)); n != len(c) || err != nil {
						t.Fatalf("Write = %d, %v", n, err)
					}
				}
				got, ok := u.Finish()
				if got != tc.want || ok != tc.wantOK {
					t.Fatalf("chunks %q: got %+v %v, want %+v %v", chunks, got, ok, tc.want, tc.wantOK)
				}
			}
		})
	}
}

func TestUsageReaderLimit(t *testing.T) {
	big := "data: {\"pad\":\"" + strings.Repeat("x", 100) + "\"}\n\n"
	tests := []struct {
		name   string
		body   string
		wantOK bool
	}{
		{"long event skipped, later usage read", big + "data: {\"usage\":{\"prompt_tokens\":1}}\n\n", true},
		{"json body over limit skipped", `{"usage":{"prompt_tokens":1},"pad":"` + strings.Repeat("x", 100) + `"}`, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			u := openai.UsageReader{MaxBytes: 64}
			for i := 0; i < len(tc.body); i += 7 {
				u.Write([]byte(tc.body[i:min(i+7, len(tc.body))]))
			}
			if _, ok := u.Finish(); ok != tc.wantOK {
				t.Fatalf("ok = %v, want %v", ok, tc.wantOK)
			}
		})
	}
}

func FuzzUsageReader(f *testing.F) {
	f.Add([]byte(sseWithUsage), 5)
	f.Add([]byte(`{"usage":{"prompt_tokens":3}}`), 1)
	f.Fuzz(func(t *testing.T, body []byte, split int) {
		var whole openai.UsageReader
		whole.Write(body)
		want, wantOK := whole.Finish()
		if split <= 0 {
			split = 1
		}
		var chunked openai.UsageReader
		for i := 0; i < len(body); i += split {
			chunked.Write(body[i:min(i+split, len(body))])
		}
		got, ok := chunked.Finish()
		if got != want || ok != wantOK {
			t.Fatalf("split %d: %+v %v, whole %+v %v", split, got, ok, want, wantOK)
		}
	})
}
