package kvbench

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/scoring"
)

// sticky is a hand-written policy that sends each prefix (its first 16 tokens) to one
// server, and follows its requests as an Observer.
type sticky struct {
	mu                          sync.Mutex
	routed, first, finished     int
	open                        map[string]bool
	firstBeforeFinish, maxInFly int
}

func (*sticky) Name() string { return "sticky" }

func (s *sticky) Pick(req *scoring.Request, c []scoring.Endpoint) (scoring.Decision, error) {
	h := uint32(2166136261)
	for _, id := range req.TokenIDs[:16] {
		h = (h ^ id) * 16777619
	}
	s.mu.Lock()
	for _, e := range c {
		s.maxInFly = max(s.maxInFly, e.InFlight)
	}
	s.mu.Unlock()
	return scoring.Decision{Endpoint: c[int(h)%len(c)].Address}, nil
}

func (s *sticky) Routed(req *scoring.Request, _ string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.routed++
	if s.open == nil {
		s.open = map[string]bool{}
	}
	s.open[req.ID] = true
}

// Moved is never called: the sim serves every request where it was routed.
func (*sticky) Moved(string, string) {}

func (s *sticky) FirstToken(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.first++
	if s.open[id] {
		s.firstBeforeFinish++
	}
}

func (s *sticky) Finished(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	s.finished++
	delete(s.open, id)
}

// recordingSink checks and counts the decoded events an index would get.
type recordingSink struct {
	stored map[string]int
	bad    string
}

func (r *recordingSink) Apply(endpoint string, b *kvevents.Batch) error {
	for _, ev := range b.Events {
		if st, ok := ev.(*kvevents.BlockStored); ok {
			if len(st.TokenIDs) != len(st.BlockHashes)*st.BlockSize {
				r.bad = "token ids do not cover the blocks"
			}
			r.stored[endpoint] += len(st.BlockHashes)
		}
	}
	return nil
}

// testFleet records the policies and sinks it built. Sweeps build routers from parallel
// runs, so the factory locks.
type testFleet struct {
	mu       sync.Mutex
	policies []*sticky
	sinks    []*recordingSink
}

func (tf *testFleet) factory(env PolicyEnv) (Router, error) {
	if env.Policy == "round-robin" {
		return Router{Policy: scoring.NewRoundRobin()}, nil
	}
	p := &sticky{}
	s := &recordingSink{stored: map[string]int{}}
	tf.mu.Lock()
	defer tf.mu.Unlock()
	tf.policies = append(tf.policies, p)
	tf.sinks = append(tf.sinks, s)
	return Router{Policy: p, Events: s}, nil
}

func smallSim(tf *testFleet) SimConfig {
	c := DefaultSimConfig()
	c.Policies = tf.factory
	return c
}

func simWorkload(t *testing.T, n, requests, warmup int) *Workload {
	t.Helper()
	cfg := DefaultWorkloadConfig()
	cfg.Prefixes, cfg.Requests, cfg.Warmup, cfg.OutputTokens = n, requests, warmup, 20
	w, err := NewWorkload(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	return w
}

func TestRunSimDeterministic(t *testing.T) {
	w := simWorkload(t, 7, 60, 0)
	strip := func(rs []Result) []Result {
		out := append([]Result(nil), rs...)
		for i := range out {
			out[i].Decision = 0
		}
		return out
	}
	var runs [][]Result
	for range 2 {
		tf := &testFleet{}
		out, err := RunSim(context.Background(), smallSim(tf), w, "sticky", 8, 0)
		if err != nil {
			t.Fatal(err)
		}
		runs = append(runs, strip(out.Results))
	}
	for i := range runs[0] {
		if runs[0][i] != runs[1][i] {
			t.Fatalf("request %d differs between identical runs:\n%+v\n%+v", i, runs[0][i], runs[1][i])
		}
	}
}

func TestRunSimRoutesThroughPolicyAndEvents(t *testing.T) {
	tf := &testFleet{}
	cfg := smallSim(tf)
	w := simWorkload(t, 4, 40, 12)
	out, err := RunSim(context.Background(), cfg, w, "sticky", 4, 0)
	if err != nil {
		t.Fatal(err)
	}
	p, sink := tf.policies[0], tf.sinks[0]
	if p.routed != 52 || p.finished != 52 || p.first != 52 || p.firstBeforeFinish != 52 {
		t.Errorf("observer saw routed %d first %d (before finish %d) finished %d, want 52 each",
			p.routed, p.first, p.firstBeforeFinish, p.finished)
	}
	if p.maxInFly == 0 || p.maxInFly > 4 {
		t.Errorf("policy saw at most %d in flight on one server, want 1..4", p.maxInFly)
	}
	if sink.bad != "" || len(sink.stored) == 0 {
		t.Errorf("events: %v %s", sink.stored, sink.bad)
	}
	var lastWarm time.Duration
	for _, r := range out.Results {
		if r.Err != "" {
			t.Fatalf("request %d failed: %s", r.Seq, r.Err)
		}
		if r.Warmup {
			lastWarm = max(lastWarm, r.End)
		}
	}
	servers := map[int]string{}
	for _, r := range out.Results {
		if !r.Warmup && r.Start < lastWarm {
			t.Errorf("measured request %d started at %v, before warmup ended at %v", r.Seq, r.Start, lastWarm)
		}
		if s, ok := servers[r.Prefix]; ok && s != r.Server {
			t.Errorf("prefix %d served by %s and %s", r.Prefix, s, r.Server)
		}
		servers[r.Prefix] = r.Server
		if r.TTFT <= cfg.RTT || r.End-r.Start < r.TTFT || r.Decision <= 0 || r.PromptTokens != 2371 {
			t.Errorf("request %d: %+v", r.Seq, r)
		}
	}
	s := Summarize(out.Results, SummaryInput{PrefixTokens: 2032, BlockSize: 16})
	// After a warmup, sticky routing of 4 prefixes over 6 servers of 3.95 prompts each
	// nearly always finds the whole prefix (two prefixes hashed to one server, with four
	// requests in flight, can evict a few blocks).
	if s.HitFull < 0.95 || out.EngineHitRate == nil || *out.EngineHitRate < 0.8 {
		t.Errorf("hit_full %v engine hit rate %v", s.HitFull, optPct(out.EngineHitRate))
	}
}

func TestRunSimStickyBeatsRoundRobin(t *testing.T) {
	w := simWorkload(t, 12, 120, 0)
	ratio := map[string]float64{}
	for _, pol := range []string{"round-robin", "sticky"} {
		out, err := RunSim(context.Background(), smallSim(&testFleet{}), w, pol, 8, 0)
		if err != nil {
			t.Fatal(err)
		}
		ratio[pol] = Summarize(out.Results, SummaryInput{PrefixTokens: 2032, BlockSize: 16}).CachedRatio
	}
	if ratio["sticky"] < ratio["round-robin"]+0.2 {
		t.Errorf("cached ratio sticky %.3f vs round-robin %.3f: the fleet does not reward cache affinity",
			ratio["sticky"], ratio["round-robin"])
	}
}

func TestRunSimReplicas(t *testing.T) {
	tf := &testFleet{}
	cfg := smallSim(tf)
	cfg.Replicas = 2
	if _, err := RunSim(context.Background(), cfg, simWorkload(t, 3, 40, 0), "sticky", 4, 0); err != nil {
		t.Fatal(err)
	}
	if len(tf.policies) != 2 || tf.policies[0].routed != 20 || tf.policies[1].routed != 20 {
		t.Fatalf("replicas routed %d and %d, want 20 each", tf.policies[0].routed, tf.policies[1].routed)
	}
	for i, s := range tf.sinks {
		if len(s.stored) == 0 {
			t.Errorf("replica %d's index got no events", i)
		}
	}
}

func TestRunSimChurn(t *testing.T) {
	tf := &testFleet{}
	cfg := smallSim(tf)
	cfg.Servers = cfg.Servers[:2]
	cfg.Churn = []ChurnEvent{{At: 0, Server: 0, Leave: true}, {At: 3 * time.Second, Server: 0}}
	out, err := RunSim(context.Background(), cfg, simWorkload(t, 5, 80, 0), "round-robin", 2, 0)
	if err != nil {
		t.Fatal(err)
	}
	gone, back := cfg.Address(0), 0
	for _, r := range out.Results {
		if r.Server == gone {
			if r.Start < 3*time.Second-cfg.RTT {
				t.Errorf("request %d sent at %v went to the departed server", r.Seq, r.Start)
			}
			back++
		}
	}
	if back == 0 {
		t.Error("the server never came back")
	}
}

func TestRunSimRejects(t *testing.T) {
	tf := &testFleet{}
	chat := DefaultWorkloadConfig()
	chat.API = APIChat
	cw, _ := NewWorkload(chat, nil)
	tests := []struct {
		name   string
		mutate func(*SimConfig)
		w      *Workload
	}{
		{"no servers", func(c *SimConfig) { c.Servers = nil }, nil},
		{"tiny cache", func(c *SimConfig) { c.Servers[0].KVBytes = 10 }, nil},
		{"no replicas", func(c *SimConfig) { c.Replicas = 0 }, nil},
		{"churn of unknown server", func(c *SimConfig) { c.Churn = []ChurnEvent{{Server: 9}} }, nil},
		{"no factory", func(c *SimConfig) { c.Policies = nil }, nil},
		{"chat", func(*SimConfig) {}, cw},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := smallSim(tf)
			tt.mutate(&c)
			w := tt.w
			if w == nil {
				w = simWorkload(t, 2, 4, 0)
			}
			if _, err := RunSim(context.Background(), c, w, "sticky", 2, 0); err == nil {
				t.Fatal("no error")
			}
		})
	}
}

// TestExecuteSimSmallGrid runs a small sweep end to end: tables, JSON and plot.
func TestExecuteSimSmallGrid(t *testing.T) {
	tf := &testFleet{}
	sc := smallSim(tf)
	wl := DefaultWorkloadConfig()
	wl.Requests, wl.OutputTokens = 48, 20
	dir := t.TempDir()
	o := Options{
		Workload: wl, Prefixes: []int{2, 12}, Concurrency: []int{4, 8}, Policies: []string{"round-robin", "sticky"},
		Workers: len(sc.Servers), Reps: 2, Sweep: true, Sim: &sc, Parallel: 2, KVPolicy: "sticky",
		JSONPath: dir + "/out.json", PlotPath: dir + "/plot.svg", PlotConcurrency: 8,
	}
	var b bytes.Buffer
	res, err := Execute(context.Background(), o, &b)
	if err != nil {
		t.Fatal(err)
	}
	if len(res) != 8 {
		t.Fatalf("%d cells, want 8", len(res))
	}
	for _, want := range []string{"Request hit rate", "| 12 | 4    |", "against the bound (sticky", "Errors: 0 in 8 cells."} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("report lacks %q:\n%s", want, b.String())
		}
	}
	for _, r := range res {
		if r.Median.Errors != 0 || r.Median.Requests != 48 {
			t.Errorf("cell %v: %+v", r.Cell, r.Median)
		}
	}
}

func TestStaticPartition(t *testing.T) {
	p := NewStaticPartition()
	cands := []scoring.Endpoint{{Address: "a", Metrics: scoring.Metrics{NumGPUBlocks: 100}}, {Address: "b", Metrics: scoring.Metrics{NumGPUBlocks: 200}}}
	req := func(first uint32) *scoring.Request {
		ids := make([]uint32, 40)
		ids[0] = first
		return &scoring.Request{TokenIDs: ids}
	}
	pick := func(first uint32, c []scoring.Endpoint) string {
		d, err := p.Pick(req(first), c)
		if err != nil {
			t.Fatal(err)
		}
		return d.Endpoint
	}
	// Homes by capacity: b holds twice as many prefixes as a.
	got := map[string]int{}
	for k := uint32(1); k <= 6; k++ {
		got[pick(k, cands)]++
	}
	if got["a"] != 2 || got["b"] != 4 {
		t.Errorf("homes %v, want a:2 b:4", got)
	}
	for k := uint32(1); k <= 6; k++ {
		first := pick(k, cands)
		if again := pick(k, cands); again != first {
			t.Errorf("prefix %d moved from %s to %s", k, first, again)
		}
	}
	// A home that left is replaced.
	if pick(1, cands[:1]) != "a" {
		t.Error("prefix not rehomed on the remaining server")
	}
	if _, err := p.Pick(req(1), nil); err == nil {
		t.Error("no error without candidates")
	}
}

// TestRunSimWarmupHandsOverOnce: when several warmup requests end at the same instant
// (sticky routing makes that common), the measured phase still starts exactly once.
func TestRunSimWarmupHandsOverOnce(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		cfg := DefaultWorkloadConfig()
		cfg.Prefixes, cfg.Warmup, cfg.Requests, cfg.OutputTokens, cfg.Seed = 12, 60, 60, 20, seed
		w, err := NewWorkload(cfg, nil)
		if err != nil {
			t.Fatal(err)
		}
		sc := DefaultSimConfig()
		sc.Policies = func(PolicyEnv) (Router, error) { return Router{Policy: NewStaticPartition()}, nil }
		out, err := RunSim(context.Background(), sc, w, "partition", 8, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, r := range out.Results {
			if r.Err != "" {
				t.Fatalf("seed %d: request %d: %s", seed, r.Seq, r.Err)
			}
		}
	}
}

// chatTokens is a hand-written RequestTokenizer: a 3-token header, one token per word of
// the message (the embedded ids), a 5-token footer, as Qwen3's template lays them out.
type chatTokens struct{ words *wordTokenizer }

func (c chatTokens) PromptTokens(path string, body []byte) ([]uint32, error) {
	var b struct {
		Messages []struct {
			Content string `json:"content"`
		} `json:"messages"`
	}
	if err := json.Unmarshal(body, &b); err != nil || path != "/v1/chat/completions" {
		return nil, fmt.Errorf("not a chat body for %s: %v", path, err)
	}
	ids, err := c.words.Encode(b.Messages[0].Content)
	if err != nil {
		return nil, err
	}
	out := append([]uint32{151644, 872, 198}, ids...)
	return append(out, 151645, 198, 151644, 77091, 198), nil
}

func TestRunSimChat(t *testing.T) {
	cfg := DefaultWorkloadConfig()
	cfg.API, cfg.Prefixes, cfg.Requests, cfg.OutputTokens = APIChat, 3, 30, 10
	w, err := NewWorkload(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	tf := &testFleet{}
	sc := smallSim(tf)
	sc.Prompts = chatTokens{newWordTokenizer()}
	out, err := RunSim(context.Background(), sc, w, "sticky", 4, 0)
	if err != nil {
		t.Fatal(err)
	}
	s := Summarize(out.Results, SummaryInput{PrefixTokens: cfg.PrefixTokens, BlockSize: 16})
	if s.Errors != 0 || s.HitFull < 0.8 {
		t.Errorf("errors %d hit_full %v", s.Errors, s.HitFull)
	}
	for _, r := range out.Results {
		if r.PromptTokens != cfg.PrefixTokens+cfg.TailTokens+8 {
			t.Fatalf("request %d: %d prompt tokens, want P+T+8", r.Seq, r.PromptTokens)
		}
	}
}

// holder asks for a hold of step at every pick, records the Held each request is
// picked with, and routes like sticky.
type holder struct {
	sticky
	step time.Duration
	held map[string][]time.Duration
}

func (h *holder) Pick(req *scoring.Request, c []scoring.Endpoint) (scoring.Decision, error) {
	h.mu.Lock()
	if h.held == nil {
		h.held = map[string][]time.Duration{}
	}
	h.held[req.ID] = append(h.held[req.ID], req.Held)
	h.mu.Unlock()
	d, err := h.sticky.Pick(req, c)
	d.Hold = h.step
	return d, err
}

// A hold waits on the virtual clock and picks again, never past MaxHold: with one
// client, every request's TTFT grows by exactly the holds honoured.
func TestRunSimHolds(t *testing.T) {
	w := simWorkload(t, 2, 12, 0)
	run := func(maxHold time.Duration) (*holder, []Result) {
		t.Helper()
		p := &holder{step: 20 * time.Millisecond}
		cfg := DefaultSimConfig()
		cfg.MaxHold = maxHold
		cfg.Policies = func(PolicyEnv) (Router, error) { return Router{Policy: p}, nil }
		out, err := RunSim(context.Background(), cfg, w, "holder", 1, 0)
		if err != nil {
			t.Fatal(err)
		}
		return p, out.Results
	}
	_, direct := run(0)
	p, held := run(50 * time.Millisecond)
	want := []time.Duration{0, 20 * time.Millisecond, 40 * time.Millisecond}
	for i := range held {
		id := fmt.Sprint("req-", i)
		if fmt.Sprint(p.held[id]) != fmt.Sprint(want) {
			t.Fatalf("%s picked with Held %v, want %v (re-picked every 20ms, the hold that would pass 50ms refused)", id, p.held[id], want)
		}
		// The virtual clock is in float seconds: allow a microsecond of rounding.
		if d := held[i].TTFT - direct[i].TTFT; d < 40*time.Millisecond-time.Microsecond || d > 40*time.Millisecond+time.Microsecond {
			t.Fatalf("request %d: TTFT %v held vs %v direct, want 40ms more", i, held[i].TTFT, direct[i].TTFT)
		}
		if held[i].Server != direct[i].Server || held[i].Err != "" {
			t.Fatalf("request %d: %+v vs %+v", i, held[i], direct[i])
		}
	}
}

// countingSync publishes a message per round naming its replica and counts what it
// receives from each other replica.
type countingSync struct {
	name string
	got  map[string]int
}

func (c *countingSync) Publish() []byte { return []byte(c.name) }

func (c *countingSync) Receive(b []byte) error {
	c.got[string(b)]++
	return nil
}

func TestRunSimCarriesSync(t *testing.T) {
	tf := &testFleet{}
	cfg := smallSim(tf)
	cfg.Replicas = 3
	cfg.Sync = SyncConfig{Interval: 10 * time.Millisecond, Delay: time.Millisecond}
	var syncs []*countingSync
	cfg.Policies = func(env PolicyEnv) (Router, error) {
		rt, err := tf.factory(env)
		s := &countingSync{name: strconv.Itoa(env.Replica), got: map[string]int{}}
		syncs = append(syncs, s)
		rt.Sync = s
		return rt, err
	}
	out, err := RunSim(context.Background(), cfg, simWorkload(t, 3, 30, 0), "sticky", 3, 0)
	if err != nil {
		t.Fatal(err)
	}
	for i, s := range syncs {
		for j := range syncs {
			if n := s.got[strconv.Itoa(j)]; (i == j) != (n == 0) {
				t.Errorf("replica %d received %d messages from replica %d", i, n, j)
			}
		}
	}
	if out.SyncMessages == 0 || out.SyncBytes != 2*out.SyncMessages {
		t.Errorf("SyncMessages %d, SyncBytes %d: want some, each 1 byte delivered to 2 peers", out.SyncMessages, out.SyncBytes)
	}
}
