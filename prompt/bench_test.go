package prompt_test

import (
	"bytes"
	"encoding/json"
	"hash/maphash"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/chattemplate"
	"github.com/kvrouter/kvrouter/internal/cputime"
	"github.com/kvrouter/kvrouter/internal/testtext"
	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/prompt"
	"github.com/kvrouter/kvrouter/scoring"
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

// uniqueChat returns typicalChat's request with "Request <n>." in its user turn, so
// that only the shared system prompt can come from a cache.
func uniqueChat() func(n int) *openai.Request {
	req := typicalChat(0)
	head, tail, _ := bytes.Cut(req.Messages, []byte("__N__"))
	return func(n int) *openai.Request {
		r := *req
		r.Messages = append(append(append(make([]byte, 0, len(head)+len(tail)+12), head...), strconv.Itoa(n)...), tail...)
		return &r
	}
}

// coldOptions turn off the tokenizer's prefix cache and the template's message cache.
var coldOptions = prompt.LoadOptions{Tokenizer: []tokenizer.Option{tokenizer.WithPrefixCache(0)}, MessageCacheBytes: -1}

func benchPromptTokens(b *testing.B, o prompt.LoadOptions) {
	bl, err := prompt.LoadDir(testmodels.Dir(b, "qwen3"), o)
	if err != nil {
		b.Fatal(err)
	}
	unique := uniqueChat()
	ids, err := bl.PromptTokens(unique(-1))
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	var buf []uint32 // reused, as extproc pools its id buffers
	start, n := cputime.Process(), 0
	for b.Loop() {
		if buf, err = bl.AppendPromptTokens(buf[:0], unique(n), 0); err != nil {
			b.Fatal(err)
		}
		n++
	}
	b.ReportMetric(float64(cputime.Process()-start)/float64(n), "cpu-ns/op")
	b.ReportMetric(float64(len(ids)), "prompt-tokens")
}

// BenchmarkPromptTokensCold: render + tokenize a 2,400-token chat with the tokenizer's
// prefix cache and the template's message cache disabled, so every request decodes,
// renders and tokenizes its whole prompt.
func BenchmarkPromptTokensCold(b *testing.B) {
	benchPromptTokens(b, coldOptions)
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

// history returns the messages JSON array (without its closing bracket) of a Qwen3
// conversation of about tokens tokens: a system prompt, then user and assistant turns
// (Prose of n gives about 0.8n Qwen3 tokens).
func history(tokens int) []byte { return testtext.Conversation(tokens, 0) }

// historySizes are the conversation lengths the long-context benchmarks measure (issue
// 14: turn k at 2k, 32k and 128k tokens).
var historySizes = []struct {
	name   string
	tokens int
}{{"2k", 2000}, {"32k", 32000}, {"128k", 128000}}

// nextTurn returns the request of the turn after hist: the server's answer to the
// last user message and a new user message, both unique to n.
func nextTurn(hist []byte, n int) *openai.Request {
	tail, err := json.Marshal([]map[string]string{
		{"role": "assistant", "content": "Answer " + strconv.Itoa(n) + ". " + testtext.Prose(uint64(n)+1e6, 120)},
		{"role": "user", "content": "Question " + strconv.Itoa(n) + ". " + testtext.Prose(uint64(n)+2e6, 60)},
	})
	if err != nil {
		panic(err)
	}
	msgs := make([]byte, 0, len(hist)+len(tail))
	msgs = append(append(append(msgs, hist...), ','), tail[1:]...)
	return &openai.Request{Kind: openai.KindChat, Messages: msgs, AddGenerationPrompt: true}
}

// BenchmarkConversationTurn is the decision CPU (render + exact tokenization) of turn
// k of a conversation whose history is about 2k, 32k or 128k tokens: "warm" with the
// default caches after the previous turn was tokenized (so only the new answer and
// question, ~180 tokens, are rendered and tokenized), "cold" with the prefix and
// message caches off (the whole history every time). cpu-ns/op counts the process CPU
// of AppendPromptTokens alone, into a reused id buffer as extproc's pooled ones,
// garbage collection included as in the other benchmarks (building the next
// request's body is not counted).
func BenchmarkConversationTurn(b *testing.B) {
	dir := testmodels.Dir(b, "qwen3")
	for _, size := range historySizes {
		hist := history(size.tokens)
		for _, mode := range []struct {
			name string
			o    prompt.LoadOptions
		}{
			{"cold", coldOptions},
			{"warm", prompt.LoadOptions{}},
		} {
			b.Run(size.name+"/"+mode.name, func(b *testing.B) {
				bl, err := prompt.LoadDir(dir, mode.o)
				if err != nil {
					b.Fatal(err)
				}
				prev := &openai.Request{Kind: openai.KindChat, Messages: append(slices.Clone(hist), ']'), AddGenerationPrompt: true}
				if _, err := bl.PromptTokens(prev); err != nil { // the previous turn
					b.Fatal(err)
				}
				ids, err := bl.PromptTokens(nextTurn(hist, -1))
				if err != nil {
					b.Fatal(err)
				}
				var cpu time.Duration
				n := 0
				buf := slices.Clone(ids)
				for b.Loop() {
					b.StopTimer()
					req := nextTurn(hist, n)
					b.StartTimer()
					start := cputime.Process()
					if buf, err = bl.AppendPromptTokens(buf[:0], req, 0); err != nil {
						b.Fatal(err)
					}
					cpu += cputime.Process() - start
					n++
				}
				b.ReportMetric(float64(cpu)/float64(n), "cpu-ns/op")
				b.ReportMetric(float64(len(ids)), "prompt-tokens")
			})
		}
	}
}

// BenchmarkTurnVsCold measures issue 14's goal, turn k of a long conversation within
// 2x of a cold 2k-token request, with both under the same machine load: each
// iteration parses the body of the next turn of a 2k, 32k or 128k-token conversation
// (openai.Parse, as extproc does), computes its ids (default caches, warmed by the
// previous turn, as BenchmarkConversationTurn's warm case) and their 16-token block
// keys as the policies compute them after this package (scoring.Request.Keys with the
// Prefix extproc passes, so the history's keys come from the tokenizer's prefix
// cache), then parses a cold 2,411-token request's body and computes its ids (as
// BenchmarkPromptTokensCold, whose keys are not counted). It reports the CPU of each
// part, turn/cold, the ratio of the turn (parse, ids and keys) to the cold request
// (parse and ids), and turn/cold-ids, the same without the two parses.
func BenchmarkTurnVsCold(b *testing.B) {
	dir := testmodels.Dir(b, "qwen3")
	cold, err := prompt.LoadDir(dir, coldOptions)
	if err != nil {
		b.Fatal(err)
	}
	unique := uniqueChat()
	for _, size := range historySizes {
		hist := history(size.tokens)
		b.Run(size.name, func(b *testing.B) {
			warm, err := prompt.LoadDir(dir, prompt.LoadOptions{})
			if err != nil {
				b.Fatal(err)
			}
			var prefix tokenizer.Prefix
			req := scoring.Request{Model: "qwen3", Prefix: &prefix}
			var keys []uint64
			prev := &openai.Request{Kind: openai.KindChat, Messages: append(slices.Clone(hist), ']'), AddGenerationPrompt: true}
			for _, r := range []*openai.Request{prev, nextTurn(hist, -1)} {
				if req.TokenIDs, err = warm.AppendPromptTokensPrefix(nil, r, 0, &prefix); err != nil {
					b.Fatal(err)
				}
				keys = req.Keys(16, keys[:0])
			}
			if !bytes.Equal(turnRequestBody(hist, -1), chatRequestBody(nextTurn(hist, -1).Messages)) {
				b.Fatal("turnRequestBody is not the next turn's body")
			}
			var turnParse, turnCPU, coldParse, coldCPU, keysCPU time.Duration
			var turnBuf, coldBuf []uint32
			// step is one iteration: turn n of the conversation and a cold request,
			// each timed.
			step := func(n int) {
				b.StopTimer()
				turnBody, oneBody := turnRequestBody(hist, n), chatRequestBody(unique(n).Messages)
				b.StartTimer()
				t0 := cputime.Process()
				turn, err := openai.Parse(openai.PathChatCompletions, turnBody)
				if err != nil {
					b.Fatal(err)
				}
				t1 := cputime.Process()
				if turnBuf, err = warm.AppendPromptTokensPrefix(turnBuf[:0], turn, 0, &prefix); err != nil {
					b.Fatal(err)
				}
				t2 := cputime.Process()
				one, err := openai.Parse(openai.PathChatCompletions, oneBody)
				if err != nil {
					b.Fatal(err)
				}
				t3 := cputime.Process()
				if coldBuf, err = cold.AppendPromptTokens(coldBuf[:0], one, 0); err != nil {
					b.Fatal(err)
				}
				t4 := cputime.Process()
				req.TokenIDs = turnBuf
				keys = req.Keys(16, keys[:0])
				t5 := cputime.Process()
				turnParse += t1 - t0
				turnCPU += t2 - t1
				coldParse += t3 - t2
				coldCPU += t4 - t3
				keysCPU += t5 - t4
			}
			// The router's steady state, not its start: a few turns first (their
			// buffers grown, their memory faulted in), then the garbage of loading two
			// tokenizers collected, which the measured turns would otherwise pay for
			// (cputime counts the collector's CPU too).
			for n := -2; n > -2-turnWarmup; n-- {
				step(n)
			}
			turnParse, turnCPU, coldParse, coldCPU, keysCPU = 0, 0, 0, 0, 0
			runtime.GC()
			n := 0
			for b.Loop() {
				step(n)
				n++
			}
			b.ReportMetric(float64(turnParse)/float64(n), "parse-cpu-ns/op")
			b.ReportMetric(float64(turnCPU)/float64(n), "turn-cpu-ns/op")
			b.ReportMetric(float64(coldCPU+coldParse)/float64(n), "cold2k-cpu-ns/op")
			b.ReportMetric(float64(turnParse+turnCPU+keysCPU)/float64(coldParse+coldCPU), "turn/cold")
			b.ReportMetric(float64(turnCPU+keysCPU)/float64(coldCPU), "turn/cold-ids")
			b.ReportMetric(float64(keysCPU)/float64(n), "keys-cpu-ns/op")
			b.ReportMetric(float64(len(turnBuf)), "turn-tokens")
		})
	}
}

// BenchmarkHistoryPass is what one pass over a 128k-token conversation's messages
// (604 KB of JSON) costs each way a turn could check them: delimiting them as the
// parse does (openai.ValueEnd), comparing them with a copy as the message cache does,
// and hashing them (hash/maphash, the runtime's AES hash), the alternative to the
// comparison. It reports MB/s.
func BenchmarkHistoryPass(b *testing.B) {
	msgs := append(history(128000), ']')
	cached := bytes.Clone(msgs)
	seed := maphash.MakeSeed()
	want := maphash.Bytes(seed, cached) // a hash stored with the cached messages
	for _, pass := range []struct {
		name string
		run  func() bool
	}{
		{"delimit", func() bool { end, ok := openai.ValueEnd(msgs, 0); return ok && end == len(msgs) }},
		{"compare", func() bool { return bytes.Equal(msgs, cached) }},
		{"hash", func() bool { return maphash.Bytes(seed, msgs) == want }},
	} {
		b.Run(pass.name, func(b *testing.B) {
			b.SetBytes(int64(len(msgs)))
			for b.Loop() {
				if !pass.run() {
					b.Fatal("the pass did not find the messages whole or equal")
				}
			}
		})
	}
}

// turnWarmup is how many iterations BenchmarkTurnVsCold runs before it measures.
const turnWarmup = 3

// chatRequestBody is the body of a chat request with these messages, as a client
// sends it.
func chatRequestBody(messages []byte) []byte {
	return slices.Concat([]byte(bodyHead), messages, []byte(bodyTail))
}

const bodyHead, bodyTail = `{"model":"qwen3","messages":`, `,"stream":true,"max_tokens":256}`

// turnRequestBody is chatRequestBody of nextTurn(hist, n) built in one allocation, as
// extproc receives a body, so that the benchmark's own garbage does not add to the
// collections the measured CPU pays for.
func turnRequestBody(hist []byte, n int) []byte {
	tail := nextTurn(nil, n).Messages[1:] // the two new messages after ','
	body := make([]byte, 0, len(bodyHead)+len(hist)+1+len(tail)+len(bodyTail))
	return append(append(append(append(append(body, bodyHead...), hist...), ','), tail...), bodyTail...)
}

// BenchmarkConversationCacheMemory reports what the prefix cache holds per
// conversation after one turn of each of many conversations of each size, with the
// 16-token block keys the policies store on it and the proofs of the template's
// provenance: the bytes it accounts for (its metric) and the live heap it adds (after
// GC, once the template and its message cache are dropped), per conversation and per
// token.
func BenchmarkConversationCacheMemory(b *testing.B) {
	dir := testmodels.Dir(b, "qwen3")
	cfg := qwen3Config(b)
	for _, size := range historySizes {
		convs := max(4, 2_000_000/size.tokens)
		reqs := make([]*openai.Request, convs)
		for i := range reqs {
			reqs[i] = nextTurn(testtext.Conversation(size.tokens, uint64(i)), i)
		}
		b.Run(size.name, func(b *testing.B) {
			var heap, accounted, tokens float64
			for b.Loop() {
				reg := prometheus.NewPedanticRegistry()
				tok, err := tokenizer.LoadDir(dir, tokenizer.WithMetrics(tokenizer.NewMetrics(reg), "m"))
				if err != nil {
					b.Fatal(err)
				}
				var before, after runtime.MemStats
				runtime.GC()
				runtime.ReadMemStats(&before)
				// The message cache on, as in a router, for the provenance; the
				// template and the Builder are garbage once encodeAll returns, before the
				// heap is measured.
				tokens = encodeAll(b, tok, cfg, reqs)
				// The Builder's pool is reachable from sync's list of pools until the
				// second collection.
				runtime.GC()
				runtime.GC()
				runtime.ReadMemStats(&after)
				heap = float64(after.HeapAlloc) - float64(before.HeapAlloc)
				mfs, err := reg.Gather()
				if err != nil {
					b.Fatal(err)
				}
				for _, mf := range mfs {
					if mf.GetName() == "kvrouter_tokenizer_prefix_cache_bytes" {
						accounted = mf.GetMetric()[0].GetGauge().GetValue()
					}
				}
				runtime.KeepAlive(tok)
			}
			n := float64(len(reqs))
			b.ReportMetric(accounted/n, "cache-bytes/conv")
			b.ReportMetric(heap/n, "heap-bytes/conv")
			b.ReportMetric(accounted/tokens, "cache-bytes/token")
			b.ReportMetric(heap/tokens, "heap-bytes/token")
		})
	}
}

// encodeAll computes the ids of reqs, and their block keys as the policies store them
// with the prefix, with tok and a new chat template of cfg; it returns the ids'
// count.
func encodeAll(b *testing.B, tok *tokenizer.Tokenizer, cfg *chattemplate.TokenizerConfig, reqs []*openai.Request) float64 {
	tmpl, err := chattemplate.CompileConfig(cfg, chattemplate.Options{MessageCacheBytes: 1 << 30})
	if err != nil {
		b.Fatal(err)
	}
	bl := prompt.New(tok, tmpl, nil)
	tokens := 0.0
	var prefix tokenizer.Prefix
	var keys []uint64
	for _, req := range reqs {
		ids, err := bl.AppendPromptTokensPrefix(nil, req, 0, &prefix)
		if err != nil {
			b.Fatal(err)
		}
		sreq := scoring.Request{Model: "qwen3", TokenIDs: ids, Prefix: &prefix}
		keys = sreq.Keys(16, keys[:0])
		tokens += float64(len(ids))
	}
	prefix.Reset()
	return tokens
}

// BenchmarkConversationRender is the chat template's share of
// BenchmarkConversationTurn's warm case: rendering turn k alone into a reused buffer
// (as the Builder does), with the default message cache warmed by the previous turns.
func BenchmarkConversationRender(b *testing.B) {
	cfg := qwen3Config(b)
	for _, size := range historySizes {
		hist := history(size.tokens)
		b.Run(size.name, func(b *testing.B) {
			tmpl, err := chattemplate.CompileConfig(cfg, chattemplate.Options{})
			if err != nil {
				b.Fatal(err)
			}
			var buf []byte
			render := func(req *openai.Request) {
				if buf, err = tmpl.AppendRender(buf[:0], chattemplate.Input{Messages: req.Messages, AddGenerationPrompt: true}); err != nil {
					b.Fatal(err)
				}
			}
			render(&openai.Request{Messages: append(slices.Clone(hist), ']')})
			render(nextTurn(hist, -1))
			var cpu time.Duration
			n := 0
			for b.Loop() {
				b.StopTimer()
				req := nextTurn(hist, n)
				b.StartTimer()
				start := cputime.Process()
				render(req)
				cpu += cputime.Process() - start
				n++
			}
			b.ReportMetric(float64(cpu)/float64(n), "cpu-ns/op")
		})
	}
}

// qwen3Config is the test Qwen3's tokenizer config, for its chat template.
func qwen3Config(b *testing.B) *chattemplate.TokenizerConfig {
	raw, err := os.ReadFile(filepath.Join(testmodels.Dir(b, "qwen3"), "tokenizer_config.json"))
	if err != nil {
		b.Fatal(err)
	}
	cfg, err := chattemplate.ParseTokenizerConfig(raw)
	if err != nil {
		b.Fatal(err)
	}
	return cfg
}
