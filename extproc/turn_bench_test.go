package extproc_test

import (
	"context"
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"net/http"
	"net/http/httptest"
	"runtime"
	"strconv"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	filterv3 "github.com/envoyproxy/go-control-plane/envoy/extensions/filters/http/ext_proc/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/epp"
	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/index"
	"github.com/kvrouter/kvrouter/internal/cputime"
	"github.com/kvrouter/kvrouter/internal/testtext"
	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/policy"
	"github.com/kvrouter/kvrouter/prompt"
	"github.com/kvrouter/kvrouter/scoring"
	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

// The decision benchmark's fleet: 8 endpoints of one model whose scraped KV capacity
// is 32,768 blocks of 16 tokens (512k tokens: an 80 GB GPU's cache for an 8B model),
// each holding about 60% of it in the index, as vLLM's events would show a busy fleet.
const (
	turnEndpoints    = 8
	turnGPUBlocks    = 32768
	turnBlockSize    = 16
	turnIndexPercent = 60
	// envoyChunk is the size of each request body message Envoy sends in
	// FULL_DUPLEX_STREAMED mode: one HTTP/2 DATA frame at the protocol's default
	// SETTINGS_MAX_FRAME_SIZE, 16 KiB, as a client's body arrives.
	envoyChunk = 16 << 10
	// turnWarmup is how many exchanges of each side run before measuring: the
	// policy's table, the caches and the buffers in their steady state.
	turnWarmup = 5
)

// turnSizes are the conversation lengths issue 14's goal names: turn k at 2k, 32k and
// 128k tokens, each a conversation of its own (the three share only their system
// prompt, as conversations on one deployment do).
var turnSizes = []struct {
	name   string
	tokens int
	conv   uint64
}{{"2k", 2000, 1}, {"32k", 32000, 2}, {"128k", 128000, 3}}

// BenchmarkDecisionTurnVsCold is issue 14's goal measured at the decision, as extproc
// makes it: turn k of a 2k, 32k or 128k-token conversation against a cold 2,400-token
// single request, each iteration one exchange of each (interleaved, so both see one
// machine load), process CPU from getrusage. An exchange is the server's Process on an
// in-memory stream: request headers with a content-length, the body in 16 KiB
// FULL_DUPLEX_STREAMED chunks (accumulated, parsed, rendered with Qwen3's chat
// template, tokenized exactly, its block keys computed, looked up in the index), the
// default policy (placement) over the real fleet registry of 8 endpoints with scraped
// capacity, the decision and the body sent back, and an empty 200 response (the
// policy's Routed, FirstToken and Finished). The turn's server has the tokenizer's
// default caches, warmed by the conversation's previous turn; the cold request's has
// them off (its system prompt is tokenized every time), as prompt's
// BenchmarkTurnVsCold. The index holds each conversation's previous turn on the
// endpoint that turn was routed to, the cold requests' system prompt where the first
// of them went, and other conversations and documents filling 60% of every endpoint
// (some on the same system prompt). It reports turn/cold, the ratio of the two
// exchanges' CPU, and each side's CPU.
func BenchmarkDecisionTurnVsCold(b *testing.B) {
	d := newTurnDecision(b)
	cold := 0
	coldExchange := func() *memStream { cold++; return d.exchange(coldChat(cold)) }
	// The cold requests' shared system prompt, held where the first of them went.
	d.storeRouted(b, d.coldSrv, coldChat(0))
	for _, size := range turnSizes {
		hist := testtext.Conversation(size.tokens, size.conv)
		// The conversation's previous turn (its history and the generation prompt),
		// routed, then stored in the index where it went, as its events would show.
		d.storeRouted(b, d.turnSrv, chatRequest(append(hist, ']')))
		b.Run(size.name, func(b *testing.B) {
			var turnCPU, coldCPU time.Duration
			step := func(n int) {
				b.StopTimer()
				turn, one := d.exchange(turnBody(hist, n)), coldExchange()
				b.StartTimer()
				t0 := cputime.Process()
				d.process(b, d.turnSrv, turn)
				t1 := cputime.Process()
				d.process(b, d.coldSrv, one)
				t2 := cputime.Process()
				turnCPU += t1 - t0
				coldCPU += t2 - t1
			}
			for n := -1; n > -1-turnWarmup; n-- {
				step(n)
			}
			turnCPU, coldCPU = 0, 0
			runtime.GC()
			n := 0
			for b.Loop() {
				step(n)
				n++
			}
			b.ReportMetric(float64(turnCPU)/float64(n), "turn-cpu-ns/op")
			b.ReportMetric(float64(coldCPU)/float64(n), "cold2k-cpu-ns/op")
			b.ReportMetric(float64(turnCPU)/float64(coldCPU), "turn/cold")
			b.ReportMetric(float64(len(turnBody(hist, 0))), "turn-body-bytes")
		})
	}
}

// turnDecision is one router: the fleet registry, the index and the default policy,
// shared by two ext_proc servers that differ in their tokenizer's caches only.
type turnDecision struct {
	fleet            *fleet.Fleet
	ix               *index.Index
	turnSrv, coldSrv *extproc.Server
	turnReg          *prompt.Registry
	hdrs             *corev3.HeaderMap
	rng              *rand.Rand
	handle           uint64
}

func newTurnDecision(b *testing.B) *turnDecision {
	dir := testmodels.Dir(b, "qwen3")
	metrics := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		for _, l := range []string{
			`vllm:num_requests_running{model_name="%[1]s"} 1`,
			`vllm:num_requests_waiting{model_name="%[1]s"} 0`,
			`vllm:kv_cache_usage_perc{model_name="%[1]s"} 0.6`,
			`vllm:cache_config_info{block_size="%[2]d",num_gpu_blocks="%[3]d",model_name="%[1]s"} 1`,
		} {
			fmt.Fprintf(w, l+"\n", sbsModel, turnBlockSize, turnGPUBlocks)
		}
	}))
	b.Cleanup(metrics.Close)
	// The scrape's figures stay fresh on a clock that does not move.
	t0 := time.Now()
	cfg := fleet.Config{Scrape: fleet.DefaultScrapeConfig()}
	for i := range turnEndpoints {
		cfg.Endpoints = append(cfg.Endpoints, fleet.EndpointConfig{Address: fmt.Sprintf("10.1.0.%d:8000", i+1),
			Models: []string{sbsModel}, MetricsURL: metrics.URL + "/metrics"})
	}
	f, err := fleet.New(cfg, fleet.Options{Now: func() time.Time { return t0 }})
	if err != nil {
		b.Fatal(err)
	}
	f.ScrapeAll(context.Background())
	eps, _, _, _ := f.Candidates(sbsModel)
	if len(eps) != turnEndpoints || !eps[0].Metrics.Valid || eps[0].Metrics.NumGPUBlocks != turnGPUBlocks {
		b.Fatalf("fleet: %+v", eps)
	}
	ix, err := index.New(index.DefaultConfig(), nil)
	if err != nil {
		b.Fatal(err)
	}
	pol, err := policy.Builtin().New(config.DefaultPolicyConfig().Name, nil, policy.Deps{Index: ix, BlockSize: turnBlockSize})
	if err != nil {
		b.Fatal(err)
	}
	limits := config.DefaultLimitsConfig()
	server := func(pc prompt.Config) (*extproc.Server, *prompt.Registry) {
		pc.Models = []prompt.ModelConfig{{Name: sbsModel, Dir: dir}}
		reg, err := prompt.NewRegistry(pc, prompt.RegistryOptions{})
		if err != nil {
			b.Fatal(err)
		}
		if err := reg.LoadAll(); err != nil {
			b.Fatal(err)
		}
		return extproc.New(extproc.Options{Policy: pol, Fleet: f, Tokenizer: reg,
			MaxBodyBytes: limits.MaxBodyBytes, BodyBudgetBytes: limits.BodyBudgetBytes, MaxHold: limits.MaxHold,
			MaxPromptTokens: scoring.DefaultKVConfig().ApproxBlocks * turnBlockSize}), reg
	}
	d := &turnDecision{fleet: f, ix: ix, hdrs: &corev3.HeaderMap{}, rng: rand.New(rand.NewPCG(14, 128)), handle: 1}
	d.turnSrv, d.turnReg = server(prompt.Config{})
	d.coldSrv, _ = server(prompt.Config{PrefixCacheBytes: -1, MessageCacheBytes: -1})
	for _, h := range sbsHeaders() {
		d.hdrs.Headers = append(d.hdrs.Headers, &corev3.HeaderValue{Key: h.Key, RawValue: []byte(h.Value)})
	}
	d.fill(b, eps)
	return d
}

// fill stores other content on every endpoint up to turnIndexPercent of its capacity:
// sequences of 1k to 32k tokens, a third of them other conversations on the turns'
// system prompt (its blocks are then held everywhere), the rest unrelated.
func (d *turnDecision) fill(b *testing.B, eps []scoring.Endpoint) {
	sys := d.systemPromptIDs(b)
	for _, ep := range eps {
		d.ix.SetCapacity(ep.Address, turnGPUBlocks)
		for blocks := 0; blocks < turnGPUBlocks*turnIndexPercent/100; {
			ids := make([]uint32, 0, 32<<10)
			if d.rng.IntN(3) == 0 {
				ids = append(ids, sys...)
			}
			for n := 1<<10 + d.rng.IntN(31<<10); len(ids) < n; {
				ids = append(ids, uint32(d.rng.IntN(150000)))
			}
			blocks += d.store(b, ep.Address, ids)
		}
	}
}

// systemPromptIDs are the full blocks of the ids the turns' conversations share.
func (d *turnDecision) systemPromptIDs(b *testing.B) []uint32 {
	ids := d.ids(b, chatRequest(append(testtext.Conversation(1, 0), ']')))
	return ids[:len(ids)/turnBlockSize*turnBlockSize]
}

// ids are the prompt's token ids of a chat body, as the turn's server computes them.
func (d *turnDecision) ids(b *testing.B, body []byte) []uint32 {
	req, err := openai.Parse(openai.PathChatCompletions, body)
	if err != nil {
		b.Fatal(err)
	}
	ids, err := d.turnReg.PromptTokens(req, sbsModel)
	if err != nil {
		b.Fatal(err)
	}
	return ids
}

// store indexes ids' full blocks on endpoint as one BlockStored event and returns how
// many blocks that was.
func (d *turnDecision) store(b *testing.B, endpoint string, ids []uint32) int {
	n := len(ids) / turnBlockSize
	hs := make([]uint64, n)
	for i := range hs {
		hs[i] = d.handle
		d.handle++
	}
	if err := d.ix.Store(endpoint, 0, index.Blocks{Root: index.Root(sbsModel, "", ""), Handles: hs,
		Tokens: ids[:n*turnBlockSize], BlockSize: turnBlockSize}); err != nil {
		b.Fatal(err)
	}
	return n
}

// storeRouted runs body's exchange on srv and stores its blocks where it was routed.
func (d *turnDecision) storeRouted(b *testing.B, srv *extproc.Server, body []byte) {
	st := &destStream{memStream: memStream{msgs: d.exchange(body).msgs}}
	if err := srv.Process(st); err != nil || st.dest == "" {
		b.Fatal(err, st.dest)
	}
	d.store(b, st.dest, d.ids(b, body))
}

// exchange is the message sequence of one request with body, as Envoy sends it in
// FULL_DUPLEX_STREAMED mode: headers with the content-length, the body in envoyChunk
// messages, then an empty 200 response.
func (d *turnDecision) exchange(body []byte) *memStream {
	hdrs := &corev3.HeaderMap{Headers: append(d.hdrs.Headers[:len(d.hdrs.Headers):len(d.hdrs.Headers)],
		&corev3.HeaderValue{Key: "content-length", RawValue: []byte(strconv.Itoa(len(body)))})}
	msgs := []*extprocv3.ProcessingRequest{{
		ProtocolConfig: &extprocv3.ProtocolConfiguration{RequestBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED,
			ResponseBodyMode: filterv3.ProcessingMode_FULL_DUPLEX_STREAMED},
		Request: &extprocv3.ProcessingRequest_RequestHeaders{RequestHeaders: &extprocv3.HttpHeaders{Headers: hdrs}}}}
	for len(body) > 0 {
		n := min(len(body), envoyChunk)
		msgs = append(msgs, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_RequestBody{
			RequestBody: &extprocv3.HttpBody{Body: body[:n:n], EndOfStream: n == len(body)}}})
		body = body[n:]
	}
	msgs = append(msgs, &extprocv3.ProcessingRequest{Request: &extprocv3.ProcessingRequest_ResponseHeaders{
		ResponseHeaders: &extprocv3.HttpHeaders{Headers: &corev3.HeaderMap{Headers: []*corev3.HeaderValue{
			{Key: ":status", RawValue: []byte("200")}}}, EndOfStream: true}}})
	return &memStream{msgs: msgs}
}

// process runs one exchange on srv and checks that it was routed: the headers reply,
// one reply per streamed body chunk, the response headers reply.
func (d *turnDecision) process(b *testing.B, srv *extproc.Server, st *memStream) {
	if err := srv.Process(st); err != nil || st.replies < 3 {
		b.Fatal(err, st.replies)
	}
}

// destStream is a memStream that keeps the endpoint the decision names.
type destStream struct {
	memStream
	dest string
}

func (s *destStream) Send(r *extprocv3.ProcessingResponse) error {
	for _, h := range r.GetRequestHeaders().GetResponse().GetHeaderMutation().GetSetHeaders() {
		if h.GetHeader().GetKey() == epp.HeaderDestination {
			s.dest = string(h.GetHeader().GetRawValue())
		}
	}
	return s.memStream.Send(r)
}

// turnBody is the body of the turn after hist: the server's answer to its last user
// message and a new user message, both unique to n, built in one allocation as a body
// arrives.
func turnBody(hist []byte, n int) []byte {
	tail, err := json.Marshal([]map[string]string{
		{"role": "assistant", "content": "Answer " + strconv.Itoa(n) + ". " + testtext.Prose(uint64(n)+1e6, 120)},
		{"role": "user", "content": "Question " + strconv.Itoa(n) + ". " + testtext.Prose(uint64(n)+2e6, 60)},
	})
	if err != nil {
		panic(err)
	}
	body := make([]byte, 0, len(turnHead)+len(hist)+len(tail)+len(turnTail))
	body = append(append(append(body, turnHead...), hist...), ',')
	return append(append(body, tail[1:]...), turnTail...)
}

// chatRequest is the body of a chat request with these messages (a JSON array).
func chatRequest(messages []byte) []byte {
	return append(append([]byte(turnHead), messages...), turnTail...)
}

const turnHead, turnTail = `{"model":"` + sbsModel + `","messages":`, `,"stream":true,"max_tokens":256}`

// coldChat is a single request of about 2,400 tokens: a ~2,000-token system prompt
// shared by every such request, a short exchange and a ~340-token user turn unique to
// n (prompt's BenchmarkTurnVsCold's cold request).
func coldChat(n int) []byte {
	raw, err := json.Marshal([]map[string]string{
		{"role": "system", "content": testtext.Prose(1, 2540)},
		{"role": "user", "content": "Summarise the policy in one line."},
		{"role": "assistant", "content": "The router sends each request to the pod that caches most of its prefix."},
		{"role": "user", "content": "Request " + strconv.Itoa(n) + ". " + testtext.Prose(100, 430)},
	})
	if err != nil {
		panic(err)
	}
	return chatRequest(raw)
}
