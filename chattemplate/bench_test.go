package chattemplate_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvrouter/kvrouter/chattemplate"
	"github.com/kvrouter/kvrouter/internal/testtext"
)

// BenchChatBody is a typical 2,400-token chat: a ~2,000-token shared system prompt
// and a ~340-token user turn after a short exchange.
func benchChatMessages(tail uint64) json.RawMessage {
	msgs := []map[string]string{
		{"role": "system", "content": testtext.Prose(1, 2540)},
		{"role": "user", "content": "Summarise the policy in one line."},
		{"role": "assistant", "content": "The router sends each request to the pod that caches most of its prefix."},
		{"role": "user", "content": testtext.Prose(100+tail, 430)},
	}
	raw, _ := json.Marshal(msgs)
	return raw
}

func BenchmarkRenderQwen3Typical(b *testing.B) {
	tmpl := loadTemplate(b, "qwen3", nil)
	in := chattemplate.Input{Messages: benchChatMessages(0), AddGenerationPrompt: true}
	out, err := tmpl.Render(in)
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(out)))
	b.ReportAllocs()
	reportCPU(b, func() {
		if _, err := tmpl.Render(in); err != nil {
			b.Fatal(err)
		}
	})
}

func BenchmarkRenderQwen3Tools(b *testing.B) {
	tmpl := loadTemplate(b, "qwen3", nil)
	cases := readCases(b)
	var in chattemplate.Input
	for _, c := range cases {
		if c.Name == "multi_step_tools_reasoning" {
			in = inputFromBody(b, c.Body)
		}
	}
	b.ReportAllocs()
	reportCPU(b, func() {
		if _, err := tmpl.Render(in); err != nil {
			b.Fatal(err)
		}
	})
}

// BenchmarkRenderQwen3TypicalNoMessageCache: the same render with the long-message
// memo disabled, so the system prompt is decoded every time.
func BenchmarkRenderQwen3TypicalNoMessageCache(b *testing.B) {
	src, err := os.ReadFile(filepath.Join("testdata", "templates", "qwen3.jinja"))
	if err != nil {
		b.Fatal(err)
	}
	tmpl, err := chattemplate.Compile(string(src), chattemplate.Options{MessageCacheSize: -1})
	if err != nil {
		b.Fatal(err)
	}
	in := chattemplate.Input{Messages: benchChatMessages(0), AddGenerationPrompt: true}
	b.ReportAllocs()
	reportCPU(b, func() {
		if _, err := tmpl.Render(in); err != nil {
			b.Fatal(err)
		}
	})
}
