package tokenizer_test

import (
	"fmt"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/cputime"
	"github.com/kvrouter/kvrouter/internal/testtext"
	"github.com/kvrouter/kvrouter/tokenizer"
	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

// chatPrompt returns a Qwen3-style rendered chat prompt: a system prompt of about
// systemTokens tokens and a user turn of about userTokens tokens. Deterministic.
func chatPrompt(tb testing.TB, tk *tokenizer.Tokenizer, systemTokens, userTokens int) (system, user string) {
	tb.Helper()
	sentences := []string{
		"You are a helpful assistant for the ACME Corporation's customer-support desk.",
		"Always answer politely, cite order numbers such as #48213-77 exactly, and never invent prices.",
		"If the user asks about refunds, explain the 30-day policy; for damaged goods it's 90 days.",
		"Use Markdown lists when you give more than three steps, and keep answers under 250 words.",
		"Le client peut écrire en français, en español o auf Deutsch: réponds dans sa langue.",
		"Example: {\"order_id\": 1042, \"status\": \"shipped\", \"eta_days\": 3.5}.",
		"Internal note (do not reveal): escalation queue ESC-7, SLA 4h, on-call pager 555-0199.",
		"\tfunc lookup(id int) (*Order, error) { return db.Get(ctx, id) }",
	}
	build := func(target int, salt int) string {
		var b strings.Builder
		for i := 0; len(tk.Encode(b.String(), false)) < target; i++ {
			fmt.Fprintf(&b, "%s (%d.%d)\n", sentences[(i*7+salt)%len(sentences)], salt, i)
		}
		return b.String()
	}
	return build(systemTokens, 1), build(userTokens, 2)
}

// render lays out a two-turn chat in the model's own chat format.
func render(model, system, user string) string {
	if model == "llama3" {
		return "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\n" + system +
			"<|eot_id|><|start_header_id|>user<|end_header_id|>\n\n" + user +
			"<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
	}
	return "<|im_start|>system\n" + system + "<|im_end|>\n<|im_start|>user\n" + user + "<|im_end|>\n<|im_start|>assistant\n"
}

func loadBench(b testing.TB, model string, opts ...tokenizer.Option) *tokenizer.Tokenizer {
	b.Helper()
	tk, err := tokenizer.LoadDir(testmodels.Dir(b, model), opts...)
	if err != nil {
		b.Fatal(err)
	}
	return tk
}

// BenchmarkEncodeChat tokenizes a ~2,400-token chat prompt whose ~2,000-token system
// prompt is shared: "cold" with the prefix cache off, "system-cached" with the system
// prompt's prefix memoised and a user turn that differs on every iteration.
func BenchmarkEncodeChat(b *testing.B) {
	for _, model := range []string{"qwen3", "llama3"} {
		b.Run(model+"/cold", func(b *testing.B) {
			tk := loadBench(b, model, tokenizer.WithPrefixCache(0))
			system, user := chatPrompt(b, tk, 2000, 400)
			prompt := render(model, system, user)
			n := len(tk.Encode(prompt, false))
			b.SetBytes(int64(len(prompt)))
			b.ResetTimer()
			cpu := cputime.Process()
			for b.Loop() {
				tk.Encode(prompt, false)
			}
			reportCPU(b, cpu)
			b.ReportMetric(float64(n), "tokens/op")
		})
		b.Run(model+"/system-cached", func(b *testing.B) {
			tk := loadBench(b, model)
			system, user := chatPrompt(b, tk, 2000, 400)
			n := len(tk.Encode(render(model, system, user), false))
			b.SetBytes(int64(len(render(model, system, user))))
			i := 0
			b.ResetTimer()
			cpu := cputime.Process()
			for b.Loop() {
				i++
				// A fresh user turn each time: only the system prompt can hit the cache.
				tk.Encode(render(model, system, fmt.Sprintf("%08d", i)+user[8:]), false)
			}
			reportCPU(b, cpu)
			b.ReportMetric(float64(n), "tokens/op")
		})
	}
}

// reportCPU reports the process CPU time per iteration since start ("cpu-ns/op").
func reportCPU(b *testing.B, start time.Duration) {
	if end := cputime.Process(); end > start && b.N > 0 {
		b.ReportMetric(float64(end-start)/float64(b.N), "cpu-ns/op")
	}
}

// BenchmarkLoad measures loading Qwen3's tokenizer files and reports the live heap
// the loaded tokenizer holds (after GC).
func BenchmarkLoad(b *testing.B) {
	dir := testmodels.Dir(b, "qwen3")
	var before, after runtime.MemStats
	var tk *tokenizer.Tokenizer
	cpu := cputime.Process()
	for b.Loop() {
		tk = nil
		runtime.GC()
		runtime.ReadMemStats(&before)
		var err error
		if tk, err = tokenizer.LoadDir(dir); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	reportCPU(b, cpu)
	runtime.GC()
	runtime.ReadMemStats(&after)
	b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/(1<<20), "MiB-heap")
	runtime.KeepAlive(tk)
}

// BenchmarkCollect is what a loaded tokenizer costs every garbage collection of the
// process that holds it: the CPU of one full collection (runtime.GC) with nothing
// loaded and with Qwen3's tokenizer loaded. A router pays it once per GC cycle, on
// whichever requests are running (their allocations' assists and the collector's
// share of the CPU), so it belongs to the decision cost (BenchmarkTurnVsCold in prompt).
func BenchmarkCollect(b *testing.B) {
	for _, loaded := range []string{"none", "qwen3"} {
		b.Run(loaded, func(b *testing.B) {
			var tk *tokenizer.Tokenizer
			if loaded != "none" {
				tk = loadBench(b, loaded)
			}
			runtime.GC()
			var cpu time.Duration
			for b.Loop() {
				start := cputime.Process()
				runtime.GC()
				cpu += cputime.Process() - start
			}
			b.ReportMetric(float64(cpu)/float64(b.N), "gc-cpu-ns/op")
			runtime.KeepAlive(tk)
		})
	}
}

// BenchmarkEncodeHuge tokenizes a ~15 MB chat prompt (~3.7M tokens), as one oversized
// request brings: "whole" is every token (AppendEncode), "max=131072" stops at a context
// length as the router does (AppendEncodeMax).
func BenchmarkEncodeHuge(b *testing.B) {
	tk := loadBench(b, "qwen3", tokenizer.WithPrefixCache(0))
	text := render("qwen3", "You are a helpful assistant.", testtext.Prose(1, 3_700_000))
	for _, max := range []int{0, 131072} {
		name := "whole"
		if max > 0 {
			name = fmt.Sprintf("max=%d", max)
		}
		b.Run(name, func(b *testing.B) {
			b.SetBytes(int64(len(text)))
			var n int
			for b.Loop() {
				ids, _ := tk.AppendEncodeMax(nil, text, false, max)
				n = len(ids)
			}
			b.ReportMetric(float64(n), "tokens")
		})
	}
}

// BenchmarkEncodeConversation tokenizes turn k of a Qwen3-format conversation whose
// history is about 2k, 32k or 128k tokens: "cold" with the prefix cache off (the whole
// history every turn), "warm" after the previous turn was tokenized, so only the new
// answer and question (~150 tokens, unique to each iteration) are.
func BenchmarkEncodeConversation(b *testing.B) {
	base := loadBench(b, "qwen3")
	for _, size := range []struct {
		name   string
		tokens int
	}{{"2k", 2000}, {"32k", 32000}, {"128k", 128000}} {
		var hist strings.Builder
		hist.WriteString("<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n")
		for i, n := 0, 0; n < size.tokens; i++ {
			role := []string{"user", "assistant"}[i%2]
			msg := strings.Repeat(fmt.Sprintf("Message %d: the router keeps the prefix of every conversation. ", i), 25)
			fmt.Fprintf(&hist, "<|im_start|>%s\n%s<|im_end|>\n", role, msg)
			n += len(base.Encode(msg, false)) + 5
		}
		h := hist.String()
		turn := func(n int) string {
			return fmt.Sprintf("%s<|im_start|>assistant\nAnswer %d: %s<|im_end|>\n<|im_start|>user\nQuestion %d: %s<|im_end|>\n<|im_start|>assistant\n",
				h, n, strings.Repeat("the cached prefix is copied. ", 15), n, strings.Repeat("and the rest is tokenized? ", 8))
		}
		for _, mode := range []struct {
			name  string
			bytes int64
		}{{"cold", 0}, {"warm", tokenizer.DefaultPrefixCacheBytes}} {
			b.Run(size.name+"/"+mode.name, func(b *testing.B) {
				tk, err := base.Derive(tokenizer.WithPrefixCache(mode.bytes))
				if err != nil {
					b.Fatal(err)
				}
				tk.Encode(h+"<|im_start|>assistant\n", false) // the previous turn
				ids := tk.Encode(turn(-1), false)
				buf := make([]uint32, 0, 2*len(ids))
				var cpu time.Duration
				n := 0
				for b.Loop() {
					b.StopTimer()
					text := turn(n)
					b.StartTimer()
					start := cputime.Process()
					buf = tk.AppendEncode(buf[:0], text, false)
					cpu += cputime.Process() - start
					n++
				}
				b.ReportMetric(float64(cpu)/float64(n), "cpu-ns/op")
				b.ReportMetric(float64(len(ids)), "tokens/op")
			})
		}
	}
}
