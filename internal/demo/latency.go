package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/structpb"

	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/extproc/envoytest"
	"github.com/kvrouter/kvrouter/internal/app"
	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/prompt"
	"github.com/kvrouter/kvrouter/sim/server"
)

// LatencyOptions configure MeasureLatency.
type LatencyOptions struct {
	// Endpoints lists the fleet sizes measured (the issue asks for 6 and 64).
	Endpoints []int
	// Rate is the open-loop arrival rate in exchanges per second; Duration how long each
	// measured round lasts; Rounds how many rounds of each server, alternating.
	Rate     float64
	Duration time.Duration
	Rounds   int
	// Model and TokenizerDir: the model the requests name and its tokenizer.
	Model        string
	TokenizerDir string
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// DefaultLatencyOptions: 6 and 64 endpoints, 1,000 exchanges/s, 2 rounds of 3 s each.
func DefaultLatencyOptions() LatencyOptions {
	return LatencyOptions{Endpoints: []int{6, 64}, Rate: 1000, Duration: 3 * time.Second, Rounds: 2,
		Model: "Qwen/Qwen3-0.6B", TokenizerDir: ".cache/models/qwen3"}
}

// LatencyRound is one measured round of one server.
type LatencyRound struct {
	Server    string // "kvrouter" or "trivial"
	Endpoints int
	Result    envoytest.LoadResult
	// CPUPerExchange is this process's CPU time (user + system) over the round divided by
	// the exchanges: the load generator's share is the same for both servers, so the
	// difference is what kvrouter's routing costs.
	CPUPerExchange time.Duration
}

func processCPU() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// latencyChat is a chat request of about 2,400 prompt tokens whose first 2,032 tokens or
// so are a system prompt shared with the warm-up traffic, so the index lookup walks a
// long matched prefix on one endpoint.
func latencyChat(model string, shared, tail string) []byte {
	return fmt.Appendf(nil, `{"model":%q,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":128}`,
		model, shared, tail)
}

func words(seed, n int) string {
	vocab := strings.Fields("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec romeo sierra tango uniform victor whiskey xray yankee zulu")
	var b strings.Builder
	x := uint32(seed*2654435761 + 1)
	for i := range n {
		x ^= x << 13
		x ^= x >> 17
		x ^= x << 5
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(vocab[x%uint32(len(vocab))])
	}
	return b.String()
}

// MeasureLatency measures the ext_proc round trip Envoy sees (stream open to the last
// request-phase reply, envoytest.Load at a fixed open-loop rate over loopback TCP) of the
// real kvrouter runner (kv policy, exact tokenization and chat template, an index fed by
// real KV events from simulated servers that were sent realistic traffic first) and, in
// the same run and alternating round by round, of a trivial ext_proc server that answers
// without parsing or scoring.
func MeasureLatency(ctx context.Context, o LatencyOptions, dir string) (_ []LatencyRound, err error) {
	logf := func(format string, a ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, "kvdemo latency: "+format+"\n", a...)
		}
	}
	if o.TokenizerDir, err = filepath.Abs(o.TokenizerDir); err != nil {
		return nil, err
	}
	b, err := prompt.LoadDir(o.TokenizerDir, prompt.LoadOptions{})
	if err != nil {
		return nil, fmt.Errorf("demo: tokenizer: %w (run `make models`)", err)
	}
	trivial, err := envoytest.TCP(func(g *grpc.Server) { extprocv3.RegisterExternalProcessorServer(g, trivialServer{}) })
	if err != nil {
		return nil, err
	}
	defer trivial.Close()

	shared := words(1, 1200)
	req := envoytest.Request{Headers: envoytest.Headers{{Key: ":method", Value: "POST"}, {Key: ":path", Value: "/v1/chat/completions"},
		{Key: ":authority", Value: "gw"}, {Key: "content-type", Value: "application/json"}},
		Body: [][]byte{latencyChat(o.Model, shared, words(2, 215))}}
	ids, err := b.PromptTokens(mustRequest(req.Body[0]))
	if err != nil {
		return nil, err
	}
	logf("request: %d prompt tokens, %d bytes", len(ids), len(req.Body[0]))

	var out []LatencyRound
	for _, n := range o.Endpoints {
		rounds, err := measureFleet(ctx, o, dir, b, n, shared, req, trivial, logf)
		if err != nil {
			return out, err
		}
		out = append(out, rounds...)
	}
	return out, nil
}

func mustRequest(body []byte) *openai.Request {
	r, err := prompt.RequestFromBody(body)
	if err != nil {
		panic(err) // the body above is well-formed
	}
	return r
}

func measureFleet(ctx context.Context, o LatencyOptions, dir string, b *prompt.Builder, n int, shared string,
	req envoytest.Request, trivial *envoytest.Conn, logf func(string, ...any)) ([]LatencyRound, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()

	var servers []serverAddrs
	for range n {
		cfg := server.DefaultConfig()
		cfg.Model = o.Model
		cfg.TimeScale = 50
		cfg.EnablePromptTokensDetails = true
		cfg.Engine.NumGPUBlocks = 585
		cfg.KVEvents.EnableKVCacheEvents = true
		cfg.KVEvents.Endpoint = "tcp://127.0.0.1:0"
		cfg.KVEvents.Bind = true
		srv, err := server.New(cfg, server.Options{Tokenizer: b, Chat: b})
		if err != nil {
			return nil, err
		}
		wg.Go(func() { _ = srv.Run(ctx) })
		pub, _, err := srv.PublisherAddr(ctx, 0)
		if err != nil {
			return nil, err
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		hs := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 10 * time.Second}
		wg.Go(func() { _ = hs.Serve(ln) })
		wg.Go(func() { <-ctx.Done(); hs.Close() })
		servers = append(servers, serverAddrs{HTTP: ln.Addr().String(), Events: "tcp://" + strings.TrimPrefix(pub, "tcp://")})
	}
	do := &Options{Model: o.Model, TokenizerDir: o.TokenizerDir}
	path := filepath.Join(dir, fmt.Sprintf("kvrouter-latency-%d.yaml", n))
	if err := os.WriteFile(path, routerConfigScrape(do, servers, "kv", "127.0.0.1:0", "127.0.0.1:0", "127.0.0.1:0", false), 0o644); err != nil {
		return nil, err
	}
	cfg, err := config.Load(path)
	if err != nil {
		return nil, err
	}
	a, err := app.New(cfg, app.Options{Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	addrs, err := a.Listen()
	if err != nil {
		return nil, err
	}
	wg.Go(func() { _ = a.Run(ctx) })
	st := &inproc{routerURL: "http://" + addrs.Metrics, gatewayURL: "http://" + addrs.Metrics}
	if err := waitReady(ctx, st, n, 60*time.Second); err != nil {
		return nil, err
	}

	// Warm the caches: every server gets 2,400-token chats directly (their blocks reach
	// the index through the KV events), the first one the measured request's system prompt.
	logf("%d endpoints: warming %d servers' caches", n, n)
	if err := warm(ctx, servers, o.Model, shared); err != nil {
		return nil, err
	}
	kv := waitIndexed(ctx, st.routerURL, n)
	logf("%d endpoints: index holds %d blocks", n, kv)

	conn, err := grpc.NewClient(addrs.ExtProc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	kvClient := extprocv3.NewExternalProcessorClient(conn)
	lc := envoytest.LoadConfig{Rate: o.Rate, Requests: max(1, int(o.Rate*o.Duration.Seconds())), Config: envoytest.FullDuplex(), Request: req}
	// A short unmeasured run of each first (connections, caches, JIT of the pools).
	warmLC := lc
	warmLC.Requests = max(1, lc.Requests/10)
	envoytest.Load(ctx, kvClient, warmLC)
	envoytest.Load(ctx, trivial.Client, warmLC)

	var out []LatencyRound
	for r := range o.Rounds {
		for _, s := range []struct {
			name   string
			client extprocv3.ExternalProcessorClient
		}{{"kvrouter", kvClient}, {"trivial", trivial.Client}} {
			cpu0 := processCPU()
			res := envoytest.Load(ctx, s.client, lc)
			cpu := (processCPU() - cpu0) / time.Duration(max(1, res.Sent))
			if res.Errors > 0 {
				return out, fmt.Errorf("demo: %s at %d endpoints: %d errors, first: %w", s.name, n, res.Errors, res.FirstError)
			}
			logf("%d endpoints, round %d, %-8s %v cpu/exchange=%v", n, r+1, s.name, res, cpu)
			out = append(out, LatencyRound{Server: s.name, Endpoints: n, Result: res, CPUPerExchange: cpu})
		}
	}
	return out, nil
}

// warm sends each server three 2,400-token chats directly (distinct system prompts) and
// the first server one with the measured request's system prompt.
func warm(ctx context.Context, servers []serverAddrs, model, shared string) error {
	client := &http.Client{Timeout: time.Minute}
	var wg sync.WaitGroup
	errc := make(chan error, len(servers))
	for i, s := range servers {
		wg.Go(func() {
			for j := range 3 {
				sys := words(100+10*i+j, 1200)
				if i == 0 && j == 0 {
					sys = shared
				}
				body := fmt.Appendf(nil, `{"model":%q,"messages":[{"role":"system","content":%q},{"role":"user","content":%q}],"max_tokens":4}`,
					model, sys, words(7000+10*i+j, 215))
				req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+s.HTTP+"/v1/chat/completions", strings.NewReader(string(body)))
				if err != nil {
					errc <- err
					return
				}
				req.Header.Set("Content-Type", "application/json")
				resp, err := client.Do(req)
				if err != nil {
					errc <- err
					return
				}
				io.Copy(io.Discard, resp.Body)
				resp.Body.Close()
				if resp.StatusCode != http.StatusOK {
					errc <- fmt.Errorf("demo: warm-up request: HTTP %d", resp.StatusCode)
					return
				}
			}
		})
	}
	wg.Wait()
	close(errc)
	return errors.Join(func() []error {
		var es []error
		for e := range errc {
			es = append(es, e)
		}
		return es
	}()...)
}

// waitIndexed waits (up to 10 s) until every endpoint has blocks in the index and returns
// the total.
func waitIndexed(ctx context.Context, routerURL string, n int) int {
	deadline := time.Now().Add(10 * time.Second)
	total := 0
	for time.Now().Before(deadline) && ctx.Err() == nil {
		resp, err := http.Get(routerURL + "/debug/kv")
		if err == nil {
			var kv []app.KVEndpoint
			err = json.NewDecoder(resp.Body).Decode(&kv)
			resp.Body.Close()
			if err == nil {
				total = 0
				withBlocks := 0
				for _, e := range kv {
					total += e.IndexedBlocks
					if e.IndexedBlocks > 0 {
						withBlocks++
					}
				}
				if withBlocks == n {
					return total
				}
			}
		}
		time.Sleep(50 * time.Millisecond)
	}
	return total
}

// trivialServer is the baseline: a correct FULL_DUPLEX_STREAMED ext_proc peer that names
// a fixed destination without parsing or scoring anything (the least an ext_proc
// endpoint picker can do).
type trivialServer struct {
	extprocv3.UnimplementedExternalProcessorServer
}

const trivialDest = "127.0.0.1:8000"

func (trivialServer) Process(srv extprocv3.ExternalProcessor_ProcessServer) error {
	decision := func() *extprocv3.ProcessingResponse {
		return &extprocv3.ProcessingResponse{
			Response: &extprocv3.ProcessingResponse_RequestHeaders{RequestHeaders: &extprocv3.HeadersResponse{
				Response: &extprocv3.CommonResponse{ClearRouteCache: true, HeaderMutation: &extprocv3.HeaderMutation{
					SetHeaders: []*corev3.HeaderValueOption{{Header: &corev3.HeaderValue{Key: "x-gateway-destination-endpoint", RawValue: []byte(trivialDest)},
						AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD}}}}}},
			DynamicMetadata: &structpb.Struct{Fields: map[string]*structpb.Value{"envoy.lb": structpb.NewStructValue(&structpb.Struct{
				Fields: map[string]*structpb.Value{"x-gateway-destination-endpoint": structpb.NewStringValue(trivialDest)}})}},
		}
	}
	streamed := func(body []byte, eos, response bool) *extprocv3.ProcessingResponse {
		br := &extprocv3.BodyResponse{Response: &extprocv3.CommonResponse{BodyMutation: &extprocv3.BodyMutation{
			Mutation: &extprocv3.BodyMutation_StreamedResponse{StreamedResponse: &extprocv3.StreamedBodyResponse{Body: body, EndOfStream: eos}}}}}
		if response {
			return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseBody{ResponseBody: br}}
		}
		return &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestBody{RequestBody: br}}
	}
	var body []byte
	for {
		msg, err := srv.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			return err
		}
		var replies []*extprocv3.ProcessingResponse
		switch r := msg.Request.(type) {
		case *extprocv3.ProcessingRequest_RequestHeaders:
			if r.RequestHeaders.GetEndOfStream() {
				replies = append(replies, decision())
			}
		case *extprocv3.ProcessingRequest_RequestBody:
			body = append(body, r.RequestBody.GetBody()...)
			if r.RequestBody.GetEndOfStream() {
				replies = append(replies, decision(), streamed(body, true, false))
			}
		case *extprocv3.ProcessingRequest_RequestTrailers:
			replies = append(replies, decision(), streamed(body, false, false),
				&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_RequestTrailers{RequestTrailers: &extprocv3.TrailersResponse{}}})
		case *extprocv3.ProcessingRequest_ResponseHeaders:
			replies = append(replies, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseHeaders{
				ResponseHeaders: &extprocv3.HeadersResponse{Response: &extprocv3.CommonResponse{}}}})
		case *extprocv3.ProcessingRequest_ResponseBody:
			replies = append(replies, streamed(r.ResponseBody.GetBody(), r.ResponseBody.GetEndOfStream(), true))
		case *extprocv3.ProcessingRequest_ResponseTrailers:
			replies = append(replies, &extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ResponseTrailers{
				ResponseTrailers: &extprocv3.TrailersResponse{}}})
		}
		for _, rep := range replies {
			if err := srv.Send(rep); err != nil {
				return err
			}
		}
	}
}

// WriteLatency prints the rounds side by side with the kvrouter / trivial ratios.
func WriteLatency(w io.Writer, o LatencyOptions, rounds []LatencyRound) error {
	var b strings.Builder
	fmt.Fprintf(&b, "\next_proc round trip (stream open to last request reply), %.0f exchanges/s open loop, %v per round, loopback TCP\n\n", o.Rate, o.Duration)
	b.WriteString("| endpoints | round | kvrouter p50 / p99 | trivial p50 / p99 | ratio p50 / p99 | kvrouter decision p50 / p99 | CPU per exchange kvrouter / trivial | achieved req/s |\n|---|---|---|---|---|---|---|---|\n")
	us := func(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond)) }
	for i := 0; i+1 < len(rounds); i += 2 {
		k, t := rounds[i].Result, rounds[i+1].Result
		fmt.Fprintf(&b, "| %d | %d | %s / %s | %s / %s | %.2f / %.2f | %s / %s | %s / %s | %.0f / %.0f |\n", rounds[i].Endpoints, i/2%max(1, o.Rounds)+1,
			us(k.P50), us(k.P99), us(t.P50), us(t.P99), float64(k.P50)/float64(t.P50), float64(k.P99)/float64(t.P99),
			us(k.DecisionP50), us(k.DecisionP99), us(rounds[i].CPUPerExchange), us(rounds[i+1].CPUPerExchange), k.AchievedRatePerS, t.AchievedRatePerS)
	}
	_, err := io.WriteString(w, b.String())
	return err
}
