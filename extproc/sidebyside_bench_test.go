package extproc_test

import (
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"

	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/index"
	"github.com/kvrouter/kvrouter/internal/cputime"
	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/prompt"
	"github.com/kvrouter/kvrouter/scoring"
	"github.com/kvrouter/kvrouter/testbench/fakeenvoy"
	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

var (
	sbsRate     = flag.Float64("rate", 1000, "BenchmarkSideBySide: exchanges started per second on each server")
	sbsSeconds  = flag.Float64("seconds", 3, "BenchmarkSideBySide: length of each run")
	sbsGRPCOpts = flag.Bool("grpcopts", true, "BenchmarkSideBySide: serve both with extproc.ServerOptions()")
)

// The side-by-side workload is the reference experiment's: 7 shared system prompts of
// ~2,030 tokens and a unique ~340-token user message, about 2,400 prompt tokens and
// 10 KB of chat JSON per request, for a model the Qwen3 tokenizer serves.
const (
	sbsModel    = "Qwen/Qwen3-0.6B"
	sbsPrefixes = 7
)

var sbsWords = strings.Fields(`cache router prefix token block engine request latency queue worker model
	prompt decode prefill memory kernel stream proxy gateway endpoint policy index event batch shard
	vector tensor layer head attention scheduler metric sample window budget cluster replica`)

// sbsText is n pseudo-random words from the seeded rng (about 1.1 tokens a word).
func sbsText(rng *rand.Rand, n int) string {
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(sbsWords[rng.IntN(len(sbsWords))])
		if i%17 == 16 {
			b.WriteByte('.')
		}
	}
	return b.String()
}

// sbsWorkload builds the request bodies: request i uses prefix i mod 7 and a user
// message that starts with its number, so no two user messages are alike (the
// tokenizer's segment cache can hold the shared system prompts, never the tails).
type sbsWorkload struct {
	prefixes []string
	tail     string
}

func newSBSWorkload() *sbsWorkload {
	rng := rand.New(rand.NewPCG(7, 7))
	w := &sbsWorkload{tail: sbsText(rng, 290)}
	for range sbsPrefixes {
		w.prefixes = append(w.prefixes, sbsText(rng, 1800))
	}
	return w
}

func (w *sbsWorkload) body(i int) []byte {
	return []byte(`{"model":"` + sbsModel + `","messages":[{"role":"system","content":"` + w.prefixes[i%len(w.prefixes)] +
		`"},{"role":"user","content":"Request ` + fmt.Sprint(i) + `: ` + w.tail + `"}],"stream":true,` +
		`"stream_options":{"include_usage":true},"max_tokens":128}`)
}

// sbsKV is the full KV path: the fleet registry, the prompt registry with the Qwen3
// tokenizer and chat template, the index, and the kv policy. Each prefix is cached on
// one endpoint (prefix p on endpoint p mod n), as it would be after a warm-up.
type sbsKV struct {
	fleet  *fleet.Fleet
	prompt *prompt.Registry
	policy *scoring.KV
	tokens int // prompt tokens of request 0
}

func newSBSKV(b *testing.B, w *sbsWorkload, n int) *sbsKV {
	dir := testmodels.Dir(b, "qwen3")
	f := newSBSFleet(b, n)
	reg, err := prompt.NewRegistry(prompt.Config{Models: []prompt.ModelConfig{{Name: sbsModel, Dir: dir}}}, prompt.RegistryOptions{})
	if err != nil {
		b.Fatal(err)
	}
	if err := reg.LoadAll(); err != nil {
		b.Fatal(err)
	}
	ix, err := index.New(index.DefaultConfig(), nil)
	if err != nil {
		b.Fatal(err)
	}
	kv, err := scoring.NewKV(scoring.DefaultKVConfig(), ix, nil, rand.NewPCG(1, 2), nil)
	if err != nil {
		b.Fatal(err)
	}
	eps, _, _, _ := f.Candidates(sbsModel)
	handle := uint64(1)
	s := &sbsKV{fleet: f, prompt: reg, policy: kv}
	for p := range sbsPrefixes {
		req, err := openai.Parse("/v1/chat/completions", w.body(p))
		if err != nil {
			b.Fatal(err)
		}
		ids, err := reg.PromptTokens(req, sbsModel)
		if err != nil {
			b.Fatal(err)
		}
		if p == 0 {
			s.tokens = len(ids)
		}
		nb := len(ids) / 16
		hs := make([]uint64, nb)
		for i := range hs {
			hs[i] = handle
			handle++
		}
		if err := ix.Store(eps[p%n].Address, 0, index.Blocks{Root: index.Root(sbsModel, "", ""), Handles: hs,
			Tokens: ids[:nb*16], BlockSize: 16}); err != nil {
			b.Fatal(err)
		}
	}
	return s
}

// newSBSFleet is the real endpoint registry with n static endpoints serving the model.
func newSBSFleet(b *testing.B, n int) *fleet.Fleet { return newRegistryFleet(b, sbsModel, n) }

// newRegistryFleet is the real endpoint registry with n static endpoints serving model
// (no metrics URL, so always eligible, routed on in-flight counts alone).
func newRegistryFleet(b *testing.B, model string, n int) *fleet.Fleet {
	cfg := fleet.Config{Scrape: fleet.DefaultScrapeConfig()}
	for i := range n {
		cfg.Endpoints = append(cfg.Endpoints, fleet.EndpointConfig{Address: fmt.Sprintf("10.1.%d.%d:8000", i/250, i%250+1),
			Models: []string{model}})
	}
	f, err := fleet.New(cfg, fleet.Options{})
	if err != nil {
		b.Fatal(err)
	}
	return f
}

func sbsHeaders() fakeenvoy.Headers {
	return fakeenvoy.Headers{{Key: ":method", Value: "POST"}, {Key: ":path", Value: "/v1/chat/completions"},
		{Key: ":authority", Value: "gw"}, {Key: "content-type", Value: "application/json"}}
}

// BenchmarkSideBySide is issue 6's "decision latency, side by side": kvrouter's ext_proc
// server and fakeenvoy.Trivial (same message sequence and replies, no parsing, no
// scoring), each on its own loopback TCP gRPC server, driven in the same open-loop run by
// the same fake Envoy at -rate exchanges/s each (2,400-token chat bodies, FDS). Variants:
// least-load over the real fleet registry, and the full KV path (exact Qwen3
// tokenization through the prompt registry, the index, the kv policy) over 6 and 64
// endpoints. It reports p50/p99 of the request phase and of the decision wait for both
// servers, their ratios, and the quantiles of the paired differences (kvrouter minus
// trivial for the same request at the same tick: what kvrouter adds, with the stalls
// of a shared machine cancelled out). Run with
//
//	go test ./extproc -run XXX -bench SideBySide -benchtime 1x -args -load [-rate 1000] [-seconds 3]
//
// (the KV variants need `make models`; KVROUTER_MODELS_DIR may point elsewhere).
func BenchmarkSideBySide(b *testing.B) {
	if !*loadBench {
		b.Skip("load run: pass -args -load")
	}
	w := newSBSWorkload()
	var sopts []grpc.ServerOption
	if *sbsGRPCOpts {
		sopts = extproc.ServerOptions()
	}
	for _, policy := range []string{"least-load", "kv"} {
		for _, n := range []int{6, 64} {
			b.Run(fmt.Sprintf("policy=%s/endpoints=%d", policy, n), func(b *testing.B) {
				o := extproc.Options{Policy: scoring.NewLeastLoad()}
				if policy == "kv" {
					kv := newSBSKV(b, w, n)
					o.Policy, o.Fleet, o.Tokenizer = kv.policy, kv.fleet, kv.prompt
					b.ReportMetric(float64(kv.tokens), "prompt-tokens")
				} else {
					o.Fleet = newSBSFleet(b, n)
				}
				router, err := fakeenvoy.TCP(extproc.New(o).Register, sopts...)
				if err != nil {
					b.Fatal(err)
				}
				defer router.Close()
				trivial, err := fakeenvoy.TCP(fakeenvoy.NewTrivial("10.1.0.1:8000").Register, sopts...)
				if err != nil {
					b.Fatal(err)
				}
				defer trivial.Close()
				cfg := fakeenvoy.LoadConfig{Rate: *sbsRate, Requests: int(*sbsRate * *sbsSeconds), Config: fakeenvoy.FullDuplex(),
					Next: func(i int) fakeenvoy.Request {
						return fakeenvoy.Request{Headers: sbsHeaders(), Body: [][]byte{w.body(i)}}
					}}
				// Warm both (connections, stacks, caches) before measuring.
				warm := cfg
				warm.Requests = min(200, cfg.Requests)
				fakeenvoy.Compare(context.Background(), []extprocv3.ExternalProcessorClient{router.Client, trivial.Client}, warm)
				var rs []fakeenvoy.LoadResult
				for b.Loop() {
					rs = fakeenvoy.Compare(context.Background(), []extprocv3.ExternalProcessorClient{router.Client, trivial.Client}, cfg)
				}
				for _, r := range rs {
					if r.Errors > 0 {
						b.Fatal(r.FirstError)
					}
				}
				kr, tr := rs[0], rs[1]
				us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
				b.ReportMetric(us(kr.P50), "kvrouter-p50-us")
				b.ReportMetric(us(kr.P99), "kvrouter-p99-us")
				b.ReportMetric(us(tr.P50), "trivial-p50-us")
				b.ReportMetric(us(tr.P99), "trivial-p99-us")
				b.ReportMetric(us(kr.P50)/us(tr.P50), "ratio-p50")
				b.ReportMetric(us(kr.P99)/us(tr.P99), "ratio-p99")
				b.ReportMetric(us(kr.DecisionP50), "kvrouter-decision-p50-us")
				b.ReportMetric(us(kr.DecisionP99), "kvrouter-decision-p99-us")
				b.ReportMetric(us(tr.DecisionP50), "trivial-decision-p50-us")
				b.ReportMetric(us(tr.DecisionP99), "trivial-decision-p99-us")
				added50, added99, addedDec50, addedDec99 := kr.Added(tr)
				b.ReportMetric(us(added50), "added-p50-us")
				b.ReportMetric(us(added99), "added-p99-us")
				b.ReportMetric(us(addedDec50), "added-decision-p50-us")
				b.ReportMetric(us(addedDec99), "added-decision-p99-us")
				b.ReportMetric(kr.AchievedRatePerS, "kvrouter-req/s")
				b.ReportMetric(tr.AchievedRatePerS, "trivial-req/s")
				b.ReportMetric(us(kr.CPUPerExchange), "cpu-us/exchange")
				b.Logf("kvrouter: %v", kr)
				b.Logf("trivial:  %v", tr)
			})
		}
	}
}

// BenchmarkServerExchangeKV is the server's own work for one FDS exchange on the full KV
// path (parse, chat template, exact Qwen3 tokenization, index lookup, kv policy, over
// the real fleet registry) without any transport: what kvrouter adds to a request.
// Each iteration is a new request (a new user message) on one of the 7 cached prefixes.
// Each Process runs on a new goroutine, as gRPC runs each stream, so that what a stream
// costs on a fresh goroutine (growing its stack) is counted.
func BenchmarkServerExchangeKV(b *testing.B) {
	w := newSBSWorkload()
	hdrs := &corev3.HeaderMap{}
	for _, h := range sbsHeaders() {
		hdrs.Headers = append(hdrs.Headers, &corev3.HeaderValue{Key: h.Key, RawValue: []byte(h.Value)})
	}
	for _, n := range []int{6, 64} {
		b.Run(fmt.Sprintf("endpoints=%d", n), func(b *testing.B) {
			kv := newSBSKV(b, w, n)
			srv := extproc.New(extproc.Options{Policy: kv.policy, Fleet: kv.fleet, Tokenizer: kv.prompt})
			bodies := make([][]byte, 4096)
			for i := range bodies {
				bodies[i] = w.body(1000 + i)
			}
			b.ReportAllocs()
			i := 0
			cpu := cputime.Process()
			for b.Loop() {
				st := &memStream{msgs: []*extprocv3.ProcessingRequest{
					{ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
						ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
						Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs}}},
					{Request: &extprocv3.ProcessingRequest_RequestBody{RequestBody: &extprocv3.HttpBody{Body: bodies[i%len(bodies)], EndOfStream: true}}},
					{Request: &extprocv3.ProcessingRequest_ResponseHeaders{ResponseHeaders: &extprocv3.HttpHeaders{
						Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{{Key: ":status", RawValue: []byte("200")}}}, EndOfStream: true}}},
				}}
				i++
				done := make(chan error)
				go func() { done <- srv.Process(st) }()
				if err := <-done; err != nil || st.replies != 3 {
					b.Fatal(err, st.replies)
				}
			}
			b.ReportMetric(float64(cputime.Process()-cpu)/float64(b.N)/1e3, "cpu-us/op")
		})
	}
}
