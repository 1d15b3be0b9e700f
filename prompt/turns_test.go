package prompt_test

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/internal/testtext"
	"github.com/kvrouter/kvrouter/prompt"
	"github.com/kvrouter/kvrouter/tokenizer"
	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

var (
	plainMu  sync.Mutex
	plainFor = map[string]*prompt.Builder{}
)

// plainBuilder returns a Builder for model with no cache at all (prefix cache and
// message cache off): the reference the cached builders are compared with.
func plainBuilder(t testing.TB, model string) *prompt.Builder {
	t.Helper()
	plainMu.Lock()
	defer plainMu.Unlock()
	if b, ok := plainFor[model]; ok {
		return b
	}
	b, err := prompt.LoadDir(testmodels.Dir(t, model), prompt.LoadOptions{Tokenizer: []tokenizer.Option{tokenizer.WithPrefixCache(0)}, MessageCacheSize: -1})
	if err != nil {
		t.Fatal(err)
	}
	plainFor[model] = b
	return b
}

// fragments are what random message contents are made of: prose, the models' added
// tokens whole and in part (a message may contain them: the cache must not cut there
// unless the split is exact), unicode that normalises across boundaries, white space
// runs and contractions.
var fragments = []string{
	"Hello", " world", ".", "\n", "\n\n", "  ", " ", "\t", " \n ", "<|im_start|>", "<|im_end|>", "<think>",
	"</think>", "<tool_call>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>", "<|begin_of_text|>",
	"<|im_", "im_end|>", "<", "|>", "é", "e\u0301", ">\u0338", "👩🏽‍🚀", "123456", "'s", "'ſ", "ſ", "{\"a\": 1}",
	"```go\nfunc f() {}\n```", "日本語", "ا", "\u00a0", "\r\n",
}

func randomContent(r *rand.Rand) string {
	var b strings.Builder
	if r.IntN(3) == 0 {
		b.WriteString(testtext.Prose(r.Uint64(), 20+r.IntN(200)))
	}
	for range r.IntN(12) {
		b.WriteString(fragments[r.IntN(len(fragments))])
	}
	return b.String()
}

// conversation returns the request bodies of the successive turns of a random
// conversation: each turn re-sends the history, the server's answer to the previous
// turn (sometimes with reasoning or a tool call and its result) and a new user message.
func conversation(seed uint64, turns int) [][]byte {
	r := rand.New(rand.NewPCG(seed, 14))
	var msgs []map[string]any
	if r.IntN(2) == 0 {
		msgs = append(msgs, map[string]any{"role": "system", "content": randomContent(r)})
	}
	kwargs := map[string]any{}
	if r.IntN(3) == 0 {
		kwargs["enable_thinking"] = false
	}
	var bodies [][]byte
	for k := range turns {
		if k > 0 {
			reply := map[string]any{"role": "assistant", "content": randomContent(r)}
			switch r.IntN(4) {
			case 0:
				reply["reasoning_content"] = randomContent(r)
			case 1:
				reply["tool_calls"] = []any{map[string]any{"id": fmt.Sprint(k), "type": "function",
					"function": map[string]any{"name": "lookup", "arguments": `{"q": "x"}`}}}
				msgs = append(msgs, reply, map[string]any{"role": "tool", "tool_call_id": fmt.Sprint(k), "content": randomContent(r)})
				reply = nil
			}
			if reply != nil {
				msgs = append(msgs, reply)
			}
		}
		msgs = append(msgs, map[string]any{"role": "user", "content": randomContent(r)})
		body, err := json.Marshal(map[string]any{"messages": msgs, "chat_template_kwargs": kwargs})
		if err != nil {
			panic(err)
		}
		bodies = append(bodies, body)
	}
	return bodies
}

// checkTurns encodes every turn of a conversation with cached and plain and
// requires identical ids (or identical failures).
func checkTurns(t *testing.T, cached, plain *prompt.Builder, bodies [][]byte) {
	t.Helper()
	for k, body := range bodies {
		req, err := prompt.RequestFromBody(body)
		if err != nil {
			t.Fatal(err)
		}
		want, wantErr := plain.PromptTokens(req)
		got, err := cached.PromptTokens(req)
		if (err == nil) != (wantErr == nil) || !slices.Equal(got, want) {
			t.Fatalf("turn %d of %s:\n cached %v (%v)\n  plain %v (%v)", k, body, got, err, want, wantErr)
		}
	}
}

// TestConversationTurnsCached is the differential test of the prefix cache on the
// real models: random multi-turn conversations (with added tokens, partial tokens
// and unicode inside messages, reasoning that Qwen3 drops from later turns, tool
// rounds) give the same ids turn after turn as a builder without caches, with a
// cache large enough to hit and one so small it evicts on every request.
func TestConversationTurnsCached(t *testing.T) {
	for _, model := range []string{"qwen3", "llama3"} {
		t.Run(model, func(t *testing.T) {
			plain := plainBuilder(t, model)
			reg := prometheus.NewPedanticRegistry()
			large, err := prompt.LoadDir(testmodels.Dir(t, model), prompt.LoadOptions{Tokenizer: []tokenizer.Option{
				tokenizer.WithMetrics(tokenizer.NewMetrics(reg), model)}})
			if err != nil {
				t.Fatal(err)
			}
			small, err := prompt.LoadDir(testmodels.Dir(t, model), prompt.LoadOptions{Tokenizer: []tokenizer.Option{tokenizer.WithPrefixCache(8 << 10)}})
			if err != nil {
				t.Fatal(err)
			}
			for seed := range uint64(40) {
				bodies := conversation(seed, 6)
				checkTurns(t, large, plain, bodies)
				checkTurns(t, small, plain, bodies)
			}
			if hits := lookups(t, reg, "hit"); hits < 40*4 {
				t.Errorf("%v cache hits over 40 six-turn conversations, want at least %d", hits, 40*4)
			}
		})
	}
}

// FuzzConversationTurns is TestConversationTurnsCached over fuzzed seeds and lengths.
func FuzzConversationTurns(f *testing.F) {
	f.Add(uint64(1), uint8(4))
	f.Add(uint64(99), uint8(9))
	type pair struct{ cached, plain *prompt.Builder }
	var pairs []pair
	for _, model := range []string{"qwen3", "llama3"} {
		b, err := prompt.LoadDir(testmodels.Dir(f, model), prompt.LoadOptions{Tokenizer: []tokenizer.Option{tokenizer.WithPrefixCache(1 << 20)}})
		if err != nil {
			f.Fatal(err)
		}
		pairs = append(pairs, pair{b, plainBuilder(f, model)})
	}
	f.Fuzz(func(t *testing.T, seed uint64, turns uint8) {
		bodies := conversation(seed, 1+int(turns%12))
		for _, p := range pairs {
			checkTurns(t, p.cached, p.plain, bodies)
		}
	})
}

// lookups sums kvrouter_tokenizer_prefix_cache_lookups_total{result} in reg.
func lookups(t *testing.T, reg *prometheus.Registry, result string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() != "kvrouter_tokenizer_prefix_cache_lookups_total" {
			continue
		}
		for _, m := range mf.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "result" && l.GetValue() == result {
					sum += m.GetCounter().GetValue()
				}
			}
		}
	}
	return sum
}
