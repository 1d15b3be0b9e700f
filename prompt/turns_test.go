package prompt_test

import (
	"encoding/json"
	"fmt"
	"maps"
	"math/rand/v2"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/index"
	"github.com/kvrouter/kvrouter/internal/testmetrics"
	"github.com/kvrouter/kvrouter/internal/testtext"
	"github.com/kvrouter/kvrouter/prompt"
	"github.com/kvrouter/kvrouter/scoring"
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
	b, err := prompt.LoadDir(testmodels.Dir(t, model), prompt.LoadOptions{Tokenizer: []tokenizer.Option{tokenizer.WithPrefixCache(0)}, MessageCacheBytes: -1})
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

// countingPrefix counts the segments whose keys a policy had to compute and store.
type countingPrefix struct {
	*tokenizer.Prefix
	stores int
}

func (p *countingPrefix) StoreSegmentKeys(i int, root uint64, bs int, keys []uint64) {
	p.stores++
	p.Prefix.StoreSegmentKeys(i, root, bs, keys)
}

// TestConversationKeysCached: the block keys of each turn, as the policies compute them
// from the tokenizer's Prefix (scoring.Request.Keys), equal the keys computed from
// scratch (index.Keys) for two roots with two block sizes, with a prefix cache large
// enough to keep the history's keys (a turn then computes those of its new segments
// only) and one so small it evicts on every request (and stays within its budget).
func TestConversationKeysCached(t *testing.T) {
	for _, model := range []string{"qwen3", "llama3"} {
		t.Run(model, func(t *testing.T) {
			for _, c := range []struct {
				name   string
				budget int64
			}{{"large", 0}, {"small", 8 << 10}} {
				t.Run(c.name, func(t *testing.T) {
					reg := prometheus.NewPedanticRegistry()
					opts := []tokenizer.Option{tokenizer.WithMetrics(tokenizer.NewMetrics(reg), model)}
					if c.budget > 0 {
						opts = append(opts, tokenizer.WithPrefixCache(c.budget))
					}
					b, err := prompt.LoadDir(testmodels.Dir(t, model), prompt.LoadOptions{Tokenizer: opts})
					if err != nil {
						t.Fatal(err)
					}
					var prefix tokenizer.Prefix
					reused, computed := 0, 0
					for seed := range uint64(20) {
						for k, body := range conversation(seed, 6) {
							req, err := prompt.RequestFromBody(body)
							if err != nil {
								t.Fatal(err)
							}
							ids, err := b.AppendPromptTokensPrefix(nil, req, 0, &prefix)
							if err != nil {
								t.Fatal(err)
							}
							// Two roots and block sizes: a span keeps two sets of keys.
							for _, rk := range []struct {
								salt string
								bs   int
							}{{"", 16}, {"s", 32}} {
								p := &countingPrefix{Prefix: &prefix}
								sreq := scoring.Request{Model: model, CacheSalt: rk.salt, TokenIDs: ids, Prefix: p}
								want := index.Keys(index.Root(model, "", rk.salt), ids, rk.bs, nil)
								if got := sreq.Keys(rk.bs, nil); !slices.Equal(got, want) {
									t.Fatalf("seed %d turn %d salt %q block size %d: keys differ from index.Keys", seed, k, rk.salt, rk.bs)
								}
								if k > 0 {
									computed += p.stores
									reused += len(prefix.Ends()) - p.stores
								}
							}
							if got := gauge(t, reg); c.budget > 0 && got > float64(c.budget) {
								t.Fatalf("cache holds %v bytes, budget %d", got, c.budget)
							}
						}
					}
					t.Logf("later turns took %d segments' keys from the cache, computed %d", reused, computed)
					if c.budget == 0 && reused <= computed {
						t.Errorf("later turns took %d segments' keys from the cache and computed %d: want most taken", reused, computed)
					}
				})
			}
		})
	}
}

// gauge returns kvrouter_tokenizer_prefix_cache_bytes in reg (one model).
func gauge(t *testing.T, reg *prometheus.Registry) float64 {
	return testmetrics.Value(t, reg, "kvrouter_tokenizer_prefix_cache_bytes")
}

// TestConversationEditedHistory: a turn's history is checked once, by the template's
// message cache, whose provenance the tokenizer then takes instead of hashing the
// text (chattemplate.Provenance). After each turn of random conversations, the turn is
// sent again with one message changed by one byte (each message in turn, the system
// prompt and the last included), cut back to an earlier turn, with tools (which change
// what the template writes before the messages) and as is: every
// request gives the ids of a builder without caches, and later turns do resume from
// their provenance.
func TestConversationEditedHistory(t *testing.T) {
	for _, model := range []string{"qwen3", "llama3"} {
		t.Run(model, func(t *testing.T) {
			plain := plainBuilder(t, model)
			reg := prometheus.NewPedanticRegistry()
			cached, err := prompt.LoadDir(testmodels.Dir(t, model), prompt.LoadOptions{Tokenizer: []tokenizer.Option{
				tokenizer.WithMetrics(tokenizer.NewMetrics(reg), model)}})
			if err != nil {
				t.Fatal(err)
			}
			for seed := range uint64(12) {
				bodies := conversation(1000+seed, 5)
				for k, body := range bodies {
					var top map[string]any
					if err := json.Unmarshal(body, &top); err != nil {
						t.Fatal(err)
					}
					msgs := top["messages"].([]any)
					variants := [][]byte{body}
					for j := range msgs {
						m := maps.Clone(msgs[j].(map[string]any))
						content, _ := m["content"].(string)
						m["content"] = content + "!"
						edited := slices.Clone(msgs)
						edited[j] = m
						variants = append(variants, withMessages(t, top, edited))
					}
					if k > 1 {
						variants = append(variants, bodies[k-2])
					}
					// Tools change the text before the messages' (Qwen3 renders them
					// in its system turn), not the messages' iterations.
					for _, name := range []string{"lookup", "search"} {
						tools := maps.Clone(top)
						tools["tools"] = []any{map[string]any{"type": "function", "function": map[string]any{"name": name, "parameters": map[string]any{"type": "object"}}}}
						variants = append(variants, withMessages(t, tools, msgs))
					}
					checkTurns(t, cached, plain, append(variants, body))
				}
			}
			if proven := testmetrics.Value(t, reg, "kvrouter_tokenizer_prefix_cache_proven_total"); proven < 12*4 {
				t.Errorf("%v encodes resumed from their provenance over 12 five-turn conversations, want at least %d", proven, 12*4)
			}
		})
	}
}

// withMessages returns the body top with its messages replaced.
func withMessages(t *testing.T, top map[string]any, msgs []any) []byte {
	t.Helper()
	b := maps.Clone(top)
	b["messages"] = msgs
	raw, err := json.Marshal(b)
	if err != nil {
		t.Fatal(err)
	}
	return raw
}

// TestConversationTurnsConcurrent runs conversations from several goroutines through
// one Builder whose prefix cache is large and one whose cache evicts on almost every
// request, so that encodes resume from provenance while others store, relink and
// evict the spans they follow (run with -race): every turn gives the ids of a builder
// without caches.
func TestConversationTurnsConcurrent(t *testing.T) {
	plain := plainBuilder(t, "qwen3")
	for _, budget := range []int64{0, 16 << 10} {
		t.Run(fmt.Sprint(budget), func(t *testing.T) {
			var opts []tokenizer.Option
			if budget > 0 {
				opts = append(opts, tokenizer.WithPrefixCache(budget))
			}
			cached, err := prompt.LoadDir(testmodels.Dir(t, "qwen3"), prompt.LoadOptions{Tokenizer: opts})
			if err != nil {
				t.Fatal(err)
			}
			var wg sync.WaitGroup
			for g := range uint64(4) {
				wg.Go(func() {
					for seed := range uint64(4) {
						bodies := conversation(seed, 6) // the same conversations in every goroutine
						if seed%2 == 1 {
							bodies = conversation(100*g+seed, 6) // and its own
						}
						for k, body := range bodies {
							req, err := prompt.RequestFromBody(body)
							if err != nil {
								t.Error(err)
								return
							}
							want, wantErr := plain.PromptTokens(req)
							got, err := cached.PromptTokens(req)
							if (err == nil) != (wantErr == nil) || !slices.Equal(got, want) {
								t.Errorf("goroutine %d seed %d turn %d: ids differ from a builder without caches", g, seed, k)
								return
							}
						}
					}
				})
			}
			wg.Wait()
		})
	}
}

// TestConversationDeferredHistory: a render leaves the bytes of the iterations it
// replays unwritten (chattemplate.Provenance's Deferred) and the tokenizer has filled
// only what it reads. Every test of the package overwrites those bytes with invalid
// UTF-8 before they are encoded (export_test.go), so a read of one never filled gives
// ids that differ from a builder's without caches (unless benchmarks run); this one
// checks it on the encodes that fill least and most: resumed from the tokenizer's cache (history never
// filled), with the tokenizer's cache evicting on every request or off (all filled
// back, while the message cache still replays), and cut at maxTokens; and that the
// renders did defer bytes.
func TestConversationDeferredHistory(t *testing.T) {
	if !prompt.DeferredPoisoning() {
		t.Skip("deferred bytes are not poisoned while benchmarks run")
	}
	for _, model := range []string{"qwen3", "llama3"} {
		plain := plainBuilder(t, model)
		for _, c := range []struct {
			name string
			opts []tokenizer.Option
		}{
			{"prefix cache", nil},
			{"prefix cache evicting", []tokenizer.Option{tokenizer.WithPrefixCache(8 << 10)}},
			{"prefix cache off", []tokenizer.Option{tokenizer.WithPrefixCache(0)}},
		} {
			t.Run(model+"/"+c.name, func(t *testing.T) {
				cached, err := prompt.LoadDir(testmodels.Dir(t, model), prompt.LoadOptions{Tokenizer: c.opts})
				if err != nil {
					t.Fatal(err)
				}
				before := prompt.DeferredPoisoned()
				for seed := range uint64(20) {
					bodies := conversation(2000+seed, 6)
					checkTurns(t, cached, plain, bodies)
					for k, body := range bodies {
						req, err := prompt.RequestFromBody(body)
						if err != nil {
							t.Fatal(err)
						}
						want, err := plain.PromptTokens(req)
						if err != nil {
							t.Fatal(err)
						}
						limit := 1 + len(want)*(k+1)/(len(bodies)+1)
						got, err := cached.AppendPromptTokens(nil, req, limit)
						if err != nil || !slices.Equal(got, want[:min(limit, len(want))]) {
							t.Fatalf("turn %d cut at %d of %d ids: %v (%v), want %v", k, limit, len(want), got, err, want[:min(limit, len(want))])
						}
					}
				}
				if n := prompt.DeferredPoisoned() - before; n < 20*4*100 {
					t.Errorf("renders deferred %d bytes over 20 six-turn conversations, want at least %d", n, 20*4*100)
				}
			})
		}
	}
}
