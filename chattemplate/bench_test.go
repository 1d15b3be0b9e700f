package chattemplate_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"runtime"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

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
	tmpl, err := chattemplate.Compile(string(src), chattemplate.Options{MessageCacheBytes: -1})
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

// BenchmarkMessageCacheMemory reports what the message cache holds for a 128k-token
// conversation (~500 messages, as prompt's BenchmarkConversationTurn builds them): the
// bytes it accounts for (its metric) and the live heap it adds (after GC), each per
// byte of the messages' raw JSON.
func BenchmarkMessageCacheMemory(b *testing.B) {
	msgs := []map[string]string{{"role": "system", "content": testtext.Prose(1, 500)}}
	for i := range 530 {
		role, size := "user", 250
		if i%2 == 1 {
			role, size = "assistant", 350
		}
		msgs = append(msgs, map[string]string{"role": role, "content": testtext.Prose(uint64(1000+i), size)})
	}
	raw, err := json.Marshal(msgs)
	if err != nil {
		b.Fatal(err)
	}
	in := chattemplate.Input{Messages: raw, AddGenerationPrompt: true}
	var heap, accounted float64
	for b.Loop() {
		reg := prometheus.NewPedanticRegistry()
		tmpl := loadTemplateWith(b, "qwen3", chattemplate.Options{Metrics: chattemplate.NewMetrics(reg), Model: "m"})
		var before, after runtime.MemStats
		runtime.GC()
		runtime.ReadMemStats(&before)
		// Twice: a first render stores the first iterations of the message loop, the
		// next (the conversation's next turn) reuses them and stores the rest.
		for range 2 {
			if _, err := tmpl.Render(in); err != nil {
				b.Fatal(err)
			}
		}
		runtime.GC()
		runtime.ReadMemStats(&after)
		heap = float64(after.HeapAlloc) - float64(before.HeapAlloc)
		mfs, err := reg.Gather()
		if err != nil {
			b.Fatal(err)
		}
		for _, mf := range mfs {
			if mf.GetName() == "kvrouter_chattemplate_message_cache_bytes" {
				accounted = mf.GetMetric()[0].GetGauge().GetValue()
			}
		}
		runtime.KeepAlive(tmpl)
	}
	b.ReportMetric(float64(len(raw)), "raw-bytes")
	b.ReportMetric(accounted/float64(len(raw)), "accounted-B/raw-B")
	b.ReportMetric(heap/float64(len(raw)), "heap-B/raw-B")
}
