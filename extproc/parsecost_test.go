package extproc_test

import (
	"encoding/json"
	"runtime"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/internal/testtext"
	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/prompt"
	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

// TestParseCostCoversPromptAllocations measures what parsing a large body and computing
// its prompt tokens allocates, as the server does (openai.Parse, then the prompt
// registry with a token limit and a pooled id buffer), and checks that the body plus
// those allocations stay within the ParseCost x body bytes the body budget charges.
// The tokenizer's own work is bounded by the token limit, not by the body: it gets a
// fixed allowance. The prefix and message caches are off: what they keep is bounded by
// their own budgets (tokenizer.prefix_cache_bytes, message_cache_bytes), and a message
// too large for the message cache is neither kept nor copied for it
// (BenchmarkPromptTokensHuge: 2.0x a 13.6 MB body, caches on).
func TestParseCostCoversPromptAllocations(t *testing.T) {
	if testing.Short() {
		t.Skip("tokenizes 2 MB bodies with three models")
	}
	if raceEnabled {
		t.Skip("the race detector's sync.Pool drops pooled buffers: allocations are not the server's (make test runs this without -race)")
	}
	const maxTokens = 131072
	// tokenizerAllowance is what tokenizing maxTokens ids may allocate beside the pooled
	// id buffer: the pre-tokenizer's pieces and the BPE's work space.
	const tokenizerAllowance = 1 << 20
	prose := testtext.Prose(1, 600_000) // ~2.2 MB, a line break every 17 words
	accented := strings.Repeat("été, déjà vu — naïve 東京 ", 40_000)
	tool := func(desc string) map[string]any {
		return map[string]any{"type": "function", "function": map[string]any{"name": "f", "description": desc,
			"parameters": map[string]any{"type": "object", "properties": map[string]any{}}}}
	}
	// A slice, not a map: the order is fixed, so each measurement is the same every run
	// (pools warmed by an earlier body change what a later one allocates).
	bodies := []struct {
		name   string
		fields map[string]any
	}{
		{"one user turn", map[string]any{"messages": []map[string]string{{"role": "user", "content": prose}}}},
		{"many turns", map[string]any{"messages": func() (m []map[string]string) {
			for i := range 2000 {
				role := [2]string{"user", "assistant"}[i%2]
				m = append(m, map[string]string{"role": role, "content": prose[i*1000 : i*1000+1000]})
			}
			return m
		}()}},
		{"non-ASCII", map[string]any{"messages": []map[string]string{{"role": "system", "content": accented}, {"role": "user", "content": "hi"}}}},
	}
	// Not covered: tool definitions, which templates re-serialize with tojson (indented),
	// cost up to 6.75x their bytes with Qwen3's template; bodies of megabytes of tools
	// are not a workload. Logged, not asserted.
	toolsBody := map[string]any{"messages": []map[string]string{{"role": "user", "content": "hi"}}, "tools": []any{tool(prose[:len(prose)/2])}}
	for _, model := range []string{"qwen3", "llama3", "llama3_1"} {
		t.Run(model, func(t *testing.T) {
			reg, err := prompt.NewRegistry(prompt.Config{Models: []prompt.ModelConfig{{Name: "m", Dir: testmodels.Dir(t, model)}},
				PrefixCacheBytes: -1, MessageCacheBytes: -1}, prompt.RegistryOptions{})
			if err != nil {
				t.Fatal(err)
			}
			ids := make([]uint32, 0, maxTokens)
			tokens := func(body []byte) {
				req, err := openai.Parse("/v1/chat/completions", body)
				if err != nil {
					t.Fatal(err)
				}
				if ids, err = reg.AppendPromptTokens(ids[:0], req, "m", maxTokens); err != nil {
					t.Fatal(err)
				}
			}
			tokens([]byte(`{"model":"m","messages":[{"role":"user","content":"warm up"}]}`)) // load the model
			measure := func(t *testing.T, fields map[string]any) (body []byte, alloc uint64) {
				fields["model"] = "m"
				body, err := json.Marshal(fields)
				if err != nil {
					t.Fatal(err)
				}
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				tokens(body)
				runtime.ReadMemStats(&after)
				alloc = after.TotalAlloc - before.TotalAlloc
				t.Logf("%d-byte body: %d bytes allocated (%.2fx the body), %d tokens", len(body), alloc, float64(alloc)/float64(len(body)), len(ids))
				return body, alloc
			}
			measure(t, toolsBody)
			for _, b := range bodies {
				t.Run(b.name, func(t *testing.T) {
					body, alloc := measure(t, b.fields)
					allowed := uint64(extproc.ParseCost-1)*uint64(len(body)) + tokenizerAllowance
					if alloc > allowed {
						t.Fatalf("parsing a %d-byte body allocated %d bytes, more than the %d the body budget charges beyond the body ((ParseCost-1) x body + %d for the tokenizer)",
							len(body), alloc, allowed, tokenizerAllowance)
					}
				})
			}
		})
	}
}
