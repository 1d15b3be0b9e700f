package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/internal/app"
	"github.com/kvrouter/kvrouter/internal/freeport"
	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/prompt"
	"github.com/kvrouter/kvrouter/testbench/fakeenvoy"
	"github.com/kvrouter/kvrouter/tlscert"
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
	// Policy is kvrouter's policy (policy.Builtin().Names); the default is kvrouter's own.
	Policy string
	// BinDir holds the kvrouter and vllm-sim binaries (make build).
	BinDir string
	// RouterEnv is added to kvrouter's environment (e.g. GOGC=400, GOMEMLIMIT=1GiB).
	RouterEnv []string
	// Trivial is the command whose `trivial-extproc --listen ADDR` subcommand serves the
	// trivial ext_proc server (program first); empty: this executable (testbench/cmd/kvdemo).
	Trivial []string
	// TrivialPprof, when set, is the address the trivial server serves /debug/pprof/ on.
	TrivialPprof string
	// Plaintext serves both ext_proc ports without TLS; by default both speak TLS with a
	// self-signed certificate (kvrouter's default), the fake Envoy skipping verification.
	Plaintext bool
	// Log receives progress lines; nil discards them.
	Log io.Writer
}

// DefaultLatencyOptions: 6 and 64 endpoints, 1,000 exchanges/s, 2 rounds of 3 s each,
// kvrouter's default policy.
func DefaultLatencyOptions() LatencyOptions {
	return LatencyOptions{Endpoints: []int{6, 64}, Rate: 1000, Duration: 3 * time.Second, Rounds: 2,
		Model: "Qwen/Qwen3-0.6B", TokenizerDir: DefaultTokenizerDir(), BinDir: "bin", Policy: config.DefaultPolicyConfig().Name}
}

// LatencyRound is one measured round of one server.
type LatencyRound struct {
	Server    string // "kvrouter" or "trivial"
	Endpoints int
	Result    fakeenvoy.LoadResult
	// CPU is each process's CPU time (user + system) and minor page faults over the
	// round divided by the round's exchanges: kvrouter, trivial, vllm-sim (the whole
	// fleet) and kvdemo (the fake Envoy), in that order. The server not measured in a
	// round is idle.
	CPU []ProcessCPU
}

// ProcessCPU is one process's CPU time and minor page faults per exchange over a round.
// A minor fault is a page the kernel had to map (and zero) for the process: a heap
// growing into new memory, or reusing memory the Go runtime had returned.
type ProcessCPU struct {
	Process     string
	PerExchange time.Duration
	// MinorFaults is the round's minor page faults per exchange.
	MinorFaults float64
}

func processUsage() (procUsage, error) {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return procUsage{}, err
	}
	return procUsage{CPU: time.Duration(ru.Utime.Nano() + ru.Stime.Nano()), MinorFaults: ru.Minflt}, nil
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
// request-phase reply, fakeenvoy.Load at a fixed open-loop rate over loopback TCP) of
// kvrouter (bin/kvrouter as its own process: o.Policy, exact tokenization and chat
// template, an index fed by real KV events from simulated servers that were sent
// realistic traffic first) and, in the same run and alternating round by round, of a
// trivial ext_proc server (fakeenvoy.Trivial in its own process, `kvdemo
// trivial-extproc`) that answers without parsing or scoring. The simulated fleet is one
// vllm-sim process (--replicas); this process is only the fake Envoy. Each round
// reports every process's CPU time per exchange.
func MeasureLatency(ctx context.Context, o LatencyOptions, dir string) (_ []LatencyRound, err error) {
	logf := func(format string, a ...any) {
		if o.Log != nil {
			fmt.Fprintf(o.Log, "kvdemo latency: "+format+"\n", a...)
		}
	}
	if o.TokenizerDir, err = filepath.Abs(o.TokenizerDir); err != nil {
		return nil, err
	}
	if len(o.Trivial) == 0 {
		exe, err := os.Executable()
		if err != nil {
			return nil, err
		}
		o.Trivial = []string{exe}
	}
	b, err := prompt.LoadDir(o.TokenizerDir, prompt.LoadOptions{})
	if err != nil {
		return nil, fmt.Errorf("demo: tokenizer: %w (run `make models`)", err)
	}
	shared := words(1, 1200)
	req := fakeenvoy.Request{Headers: fakeenvoy.Headers{{Key: ":method", Value: "POST"}, {Key: ":path", Value: "/v1/chat/completions"},
		{Key: ":authority", Value: "gw"}, {Key: "content-type", Value: "application/json"}},
		Body: [][]byte{latencyChat(o.Model, shared, words(2, 215))}}
	ids, err := b.PromptTokens(mustRequest(req.Body[0]))
	if err != nil {
		return nil, err
	}
	logf("request: %d prompt tokens, %d bytes", len(ids), len(req.Body[0]))

	var out []LatencyRound
	for _, n := range o.Endpoints {
		rounds, err := measureFleet(ctx, o, dir, n, shared, req, logf)
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

// latencyStack is one fleet size's processes: vllm-sim (all servers), kvrouter and the
// trivial ext_proc server.
type latencyStack struct {
	procStack
	servers []serverAddrs
	extproc string // kvrouter's ext_proc address
	trivial string // the trivial server's
}

func startLatencyStack(o LatencyOptions, dir string, n int) (*latencyStack, error) {
	base, err := freeport.Range(2 * n)
	if err != nil {
		return nil, err
	}
	ports, err := freePorts(5)
	if err != nil {
		return nil, err
	}
	s := &latencyStack{}
	for i := range n {
		s.servers = append(s.servers, serverAddrs{HTTP: fmt.Sprintf("127.0.0.1:%d", base+i), Events: fmt.Sprintf("tcp://127.0.0.1:%d", base+n+i)})
	}
	ev, _ := json.Marshal(map[string]any{"enable_kv_cache_events": true, "publisher": "zmq",
		"endpoint": fmt.Sprintf("tcp://127.0.0.1:%d", base+n), "bind": true})
	bin := func(name string) string { return filepath.Join(o.BinDir, name) }
	if err := s.spawn("vllm-sim", filepath.Join(dir, fmt.Sprintf("vllm-sim-%d.log", n)), nil, bin("vllm-sim"),
		"--host", "127.0.0.1", "--port", strconv.Itoa(base), "--replicas", strconv.Itoa(n), "--model", o.Model,
		"--tokenizer", o.TokenizerDir, "--kv-events-config", string(ev), "--enable-prompt-tokens-details",
		"--num-gpu-blocks-override", "585", "--time-scale", "50"); err != nil {
		return s, err
	}
	addr := func(p int) string { return fmt.Sprintf("127.0.0.1:%d", p) }
	s.extproc, s.trivial = addr(ports[0]), addr(ports[3])
	s.routerURL, s.gatewayURL, s.debugURL = "http://"+addr(ports[2]), "http://"+s.trivial, "http://"+addr(ports[4])
	do := &Options{Model: o.Model, TokenizerDir: o.TokenizerDir}
	path := filepath.Join(dir, fmt.Sprintf("kvrouter-latency-%d.yaml", n))
	if err := os.WriteFile(path, routerConfigScrape(do, s.servers, o.Policy,
		listenAddrs{extproc: s.extproc, health: addr(ports[1]), metrics: addr(ports[2]), debug: addr(ports[4]), plaintext: o.Plaintext}, false), 0o644); err != nil {
		return s, err
	}
	if err := s.spawn("kvrouter", filepath.Join(dir, fmt.Sprintf("kvrouter-%d.log", n)), o.RouterEnv, bin("kvrouter"),
		"--config", path, "--log-level", "warn"); err != nil {
		return s, err
	}
	args := append(slices.Clone(o.Trivial[1:]), "trivial-extproc", "--listen", s.trivial)
	if o.TrivialPprof != "" {
		args = append(args, "--pprof", o.TrivialPprof)
	}
	if o.Plaintext {
		args = append(args, "--plaintext")
	}
	return s, s.spawn("trivial", filepath.Join(dir, fmt.Sprintf("trivial-%d.log", n)), nil, o.Trivial[0], args...)
}

func measureFleet(ctx context.Context, o LatencyOptions, dir string, n int, shared string,
	req fakeenvoy.Request, logf func(string, ...any)) (_ []LatencyRound, err error) {
	logf("%d endpoints: starting vllm-sim (%d replicas), kvrouter and the trivial server", n, n)
	st, err := startReady(ctx, func() (*latencyStack, error) {
		st, err := startLatencyStack(o, dir, n)
		if err != nil && st != nil {
			_ = st.Close()
		}
		return st, err
	}, func(st *latencyStack) error { return waitReady(ctx, st, n, 60*time.Second) }, logf)
	if err != nil {
		return nil, err
	}
	defer st.Close()

	// Warm the caches: every server gets 2,400-token chats directly (their blocks reach
	// the index through the KV events), the first one the measured request's system prompt.
	logf("%d endpoints: warming %d servers' caches", n, n)
	if err := warm(ctx, st.servers, o.Model, shared); err != nil {
		return nil, err
	}
	kv := waitIndexed(ctx, st.debugURL, n)
	logf("%d endpoints: index holds %d blocks", n, kv)

	creds := insecure.NewCredentials()
	if !o.Plaintext {
		tc, err := tlscert.ClientConfig{}.TLS()
		if err != nil {
			return nil, err
		}
		creds = credentials.NewTLS(tc)
	}
	dial := func(addr string) (extprocv3.ExternalProcessorClient, func() error, error) {
		conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
		if err != nil {
			return nil, nil, err
		}
		return extprocv3.NewExternalProcessorClient(conn), conn.Close, nil
	}
	kvClient, closeKV, err := dial(st.extproc)
	if err != nil {
		return nil, err
	}
	defer closeKV()
	trivialClient, closeTrivial, err := dial(st.trivial)
	if err != nil {
		return nil, err
	}
	defer closeTrivial()
	lc := fakeenvoy.LoadConfig{Rate: o.Rate, Requests: max(1, int(o.Rate*o.Duration.Seconds())), Config: fakeenvoy.FullDuplex(), Request: req}
	// A short unmeasured run of each first (connections, caches, pools).
	warmLC := lc
	warmLC.Requests = max(1, lc.Requests/10)
	fakeenvoy.Load(ctx, kvClient, warmLC)
	fakeenvoy.Load(ctx, trivialClient, warmLC)

	procs := []struct {
		name  string
		usage func() (procUsage, error)
	}{{"kvrouter", st.usage("kvrouter")}, {"trivial", st.usage("trivial")}, {"vllm-sim", st.usage("vllm-sim")},
		{"kvdemo", processUsage}}
	var out []LatencyRound
	for r := range o.Rounds {
		for _, s := range []struct {
			name   string
			client extprocv3.ExternalProcessorClient
		}{{"kvrouter", kvClient}, {"trivial", trivialClient}} {
			use0 := make([]procUsage, len(procs))
			for i, p := range procs {
				if use0[i], err = p.usage(); err != nil {
					return out, err
				}
			}
			res := fakeenvoy.Load(ctx, s.client, lc)
			if res.Errors > 0 {
				return out, fmt.Errorf("demo: %s at %d endpoints: %d errors, first: %w", s.name, n, res.Errors, res.FirstError)
			}
			round := LatencyRound{Server: s.name, Endpoints: n, Result: res}
			var line strings.Builder
			for i, p := range procs {
				u, err := p.usage()
				if err != nil {
					return out, err
				}
				sent := max(1, res.Sent)
				per := (u.CPU - use0[i].CPU) / time.Duration(sent)
				faults := float64(u.MinorFaults-use0[i].MinorFaults) / float64(sent)
				round.CPU = append(round.CPU, ProcessCPU{Process: p.name, PerExchange: per, MinorFaults: faults})
				fmt.Fprintf(&line, " %s=%v (%.1f faults)", p.name, per.Round(100*time.Nanosecond), faults)
			}
			logf("%d endpoints, round %d, %-8s %v; CPU and minor page faults per exchange:%s", n, r+1, s.name, res, line.String())
			out = append(out, round)
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

// waitIndexed waits (up to 10 s) until every endpoint has blocks in the index (kvrouter's
// debug port at debugURL) and returns the total.
func waitIndexed(ctx context.Context, debugURL string, n int) int {
	deadline := time.Now().Add(10 * time.Second)
	total := 0
	for time.Now().Before(deadline) && ctx.Err() == nil {
		resp, err := http.Get(debugURL + "/debug/kv")
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

// WriteLatency prints the rounds side by side with the kvrouter / trivial ratios, then
// every process's CPU time per exchange in each round.
func WriteLatency(w io.Writer, o LatencyOptions, rounds []LatencyRound) error {
	var b strings.Builder
	transport := "TLS on both servers (self-signed, verification skipped)"
	if o.Plaintext {
		transport = "plaintext on both servers"
	}
	fmt.Fprintf(&b, "\next_proc round trip (stream open to last request reply), kvrouter policy %s, %.0f exchanges/s open loop, %v per round, loopback TCP, %s, one process each: kvrouter, trivial server, vllm-sim fleet, kvdemo (fake Envoy)\n\n", o.Policy, o.Rate, o.Duration, transport)
	b.WriteString("| endpoints | round | kvrouter p50 / p99 | trivial p50 / p99 | ratio p50 / p99 | decision p50 / p99 kvrouter | decision p50 / p99 trivial | achieved req/s |\n|---|---|---|---|---|---|---|---|\n")
	us := func(d time.Duration) string { return fmt.Sprintf("%.0f µs", float64(d)/float64(time.Microsecond)) }
	for i := 0; i+1 < len(rounds); i += 2 {
		k, t := rounds[i].Result, rounds[i+1].Result
		fmt.Fprintf(&b, "| %d | %d | %s / %s | %s / %s | %.2f / %.2f | %s / %s | %s / %s | %.0f / %.0f |\n", rounds[i].Endpoints, i/2%max(1, o.Rounds)+1,
			us(k.P50), us(k.P99), us(t.P50), us(t.P99), float64(k.P50)/float64(t.P50), float64(k.P99)/float64(t.P99),
			us(k.DecisionP50), us(k.DecisionP99), us(t.DecisionP50), us(t.DecisionP99), k.AchievedRatePerS, t.AchievedRatePerS)
	}
	if len(rounds) > 0 {
		// perProcess writes one table of a per-process figure, a row per round.
		perProcess := func(title string, cell func(ProcessCPU) string) {
			b.WriteString("\n" + title + "\n\n| endpoints | round | measured |")
			for _, p := range rounds[0].CPU {
				fmt.Fprintf(&b, " %s |", p.Process)
			}
			b.WriteString("\n|---|---|---|" + strings.Repeat("---|", len(rounds[0].CPU)) + "\n")
			for i, r := range rounds {
				fmt.Fprintf(&b, "| %d | %d | %s |", r.Endpoints, i/2%max(1, o.Rounds)+1, r.Server)
				for _, p := range r.CPU {
					b.WriteString(" " + cell(p) + " |")
				}
				b.WriteString("\n")
			}
		}
		perProcess("CPU time per exchange by process (user + system; the server not measured in a round is idle)",
			func(p ProcessCPU) string { return us(p.PerExchange) })
		perProcess("Minor page faults per exchange by process (pages the kernel mapped for it)",
			func(p ProcessCPU) string { return fmt.Sprintf("%.1f", p.MinorFaults) })
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// LatencyReport is what `kvdemo latency --json` writes: the run's settings, the load
// average before it (the machine is shared; a busy machine measures itself), and every
// round's latencies and CPU per exchange in microseconds.
type LatencyReport struct {
	Policy       string             `json:"policy"`
	Plaintext    bool               `json:"plaintext"`
	Rate         float64            `json:"rate"`
	DurationS    float64            `json:"duration_s"`
	LoadAvgStart float64            `json:"loadavg_start"`
	Rounds       []LatencyRoundJSON `json:"rounds"`
}

// LatencyRoundJSON is one round of a LatencyReport.
type LatencyRoundJSON struct {
	Server         string             `json:"server"`
	Endpoints      int                `json:"endpoints"`
	Sent           int                `json:"sent"`
	Errors         int                `json:"errors"`
	AchievedPerS   float64            `json:"achieved_per_s"`
	P50US          float64            `json:"p50_us"`
	P99US          float64            `json:"p99_us"`
	DecisionP50US  float64            `json:"decision_p50_us"`
	DecisionP99US  float64            `json:"decision_p99_us"`
	CPUPerExchange map[string]float64 `json:"cpu_us_per_exchange"`
	// MinorFaultsPerExchange is each process's minor page faults per exchange.
	MinorFaultsPerExchange map[string]float64 `json:"minor_faults_per_exchange"`
}

// NewLatencyReport converts MeasureLatency's rounds for JSON.
func NewLatencyReport(o LatencyOptions, loadAvg float64, rounds []LatencyRound) LatencyReport {
	us := func(d time.Duration) float64 { return float64(d) / float64(time.Microsecond) }
	rep := LatencyReport{Policy: o.Policy, Plaintext: o.Plaintext, Rate: o.Rate, DurationS: o.Duration.Seconds(), LoadAvgStart: loadAvg}
	for _, r := range rounds {
		j := LatencyRoundJSON{Server: r.Server, Endpoints: r.Endpoints, Sent: r.Result.Sent, Errors: r.Result.Errors,
			AchievedPerS: r.Result.AchievedRatePerS, P50US: us(r.Result.P50), P99US: us(r.Result.P99),
			DecisionP50US: us(r.Result.DecisionP50), DecisionP99US: us(r.Result.DecisionP99), CPUPerExchange: map[string]float64{},
			MinorFaultsPerExchange: map[string]float64{}}
		for _, p := range r.CPU {
			j.CPUPerExchange[p.Process] = us(p.PerExchange)
			j.MinorFaultsPerExchange[p.Process] = p.MinorFaults
		}
		rep.Rounds = append(rep.Rounds, j)
	}
	return rep
}

// LoadAverage is the machine's one-minute load average (0 where /proc/loadavg is absent).
func LoadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return 0
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0
	}
	v, _ := strconv.ParseFloat(f[0], 64)
	return v
}
