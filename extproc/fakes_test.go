package extproc_test

import (
	"errors"
	"slices"
	"sync"

	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/scoring"
)

// fakeFleet is a hand-written Fleet: a fixed endpoint list, models per endpoint, and
// in-flight counts kept by Begin/End.
type fakeFleet struct {
	mu       sync.Mutex
	order    []string            // healthy endpoints in stable order
	serves   map[string][]string // model -> endpoints
	inflight map[string]int
	metrics  map[string]scoring.Metrics // scraped figures per endpoint (zero: none)
	begins   int
	ends     int
	failed   []string // UpstreamFailed calls
}

func (f *fakeFleet) UpstreamFailed(addr string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.failed = append(f.failed, addr)
}

func (f *fakeFleet) failures() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return slices.Clone(f.failed)
}

func newFleet(order ...string) *fakeFleet {
	return &fakeFleet{order: order, serves: map[string][]string{}, inflight: map[string]int{}}
}

func (f *fakeFleet) serve(model string, addrs ...string) *fakeFleet {
	f.serves[model] = addrs
	return f
}

func (f *fakeFleet) Candidates(model string) ([]scoring.Endpoint, string, string, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var addrs []string
	ok := true
	base, lora := model, ""
	if model != "" {
		addrs, ok = f.serves[model]
	}
	if model == "" || !ok {
		addrs = f.order
	}
	var eps []scoring.Endpoint
	for _, a := range f.order { // stable order, healthy only
		if slices.Contains(addrs, a) {
			eps = append(eps, scoring.Endpoint{Address: a, InFlight: f.inflight[a], Metrics: f.metrics[a]})
		}
	}
	if model == "lora-x" {
		base, lora = "base", "lora-x"
	}
	return eps, base, lora, ok
}

func (f *fakeFleet) Begin(addr string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inflight[addr]++
	f.begins++
}

func (f *fakeFleet) End(addr string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.inflight[addr]--
	f.ends++
}

func (f *fakeFleet) inFlight(addr string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.inflight[addr]
}

func (f *fakeFleet) counts() (begins, ends int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.begins, f.ends
}

// recordingPolicy wraps least-load and records the Observer calls it receives.
type recordingPolicy struct {
	scoring.LeastLoad
	mu       sync.Mutex
	picks    []scoring.Request
	routed   []string
	first    []string
	finished []string
}

func (p *recordingPolicy) Name() string { return "recording" }

func (p *recordingPolicy) Pick(r *scoring.Request, c []scoring.Endpoint) (scoring.Decision, error) {
	p.mu.Lock()
	p.picks = append(p.picks, *r)
	p.mu.Unlock()
	return p.LeastLoad.Pick(r, c)
}

func (p *recordingPolicy) Routed(r *scoring.Request, ep string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.routed = append(p.routed, r.ID+"@"+ep)
}

func (p *recordingPolicy) FirstToken(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.first = append(p.first, id)
}

func (p *recordingPolicy) Finished(id string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.finished = append(p.finished, id)
}

func (p *recordingPolicy) snapshot() (picks []scoring.Request, routed, first, finished []string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	return slices.Clone(p.picks), slices.Clone(p.routed), slices.Clone(p.first), slices.Clone(p.finished)
}

// fixedPolicy always answers the same endpoint or error.
type fixedPolicy struct {
	endpoint string
	err      error
}

func (p fixedPolicy) Name() string { return "fixed" }

func (p fixedPolicy) Pick(*scoring.Request, []scoring.Endpoint) (scoring.Decision, error) {
	return scoring.Decision{Endpoint: p.endpoint, Fallbacks: []string{"10.0.0.3:8000", "10.0.0.2:8000", "6.6.6.6:1"}}, p.err
}

// fakeTokenizer returns one id per byte of the messages or prompt, or an error.
type fakeTokenizer struct{ fail bool }

func (t fakeTokenizer) PromptTokens(req *openai.Request, base string) ([]uint32, error) {
	if t.fail {
		return nil, errors.New("tokenizer: no template")
	}
	n := len(req.Messages) + len(req.Prompt)
	return make([]uint32, n), nil
}

// appendingTokenizer implements AppendPromptTokens: the ids are the bytes of the
// messages, appended to the router's buffer. It counts the calls that were given a
// buffer with capacity (reused).
type appendingTokenizer struct {
	mu            sync.Mutex
	calls, reused int
	maxTokens     []int // the limit of each call
}

func (t *appendingTokenizer) PromptTokens(req *openai.Request, base string) ([]uint32, error) {
	return t.AppendPromptTokens(nil, req, base, 0)
}

func (t *appendingTokenizer) AppendPromptTokens(dst []uint32, req *openai.Request, _ string, maxTokens int) ([]uint32, error) {
	t.mu.Lock()
	t.calls++
	if cap(dst) > 0 {
		t.reused++
	}
	t.maxTokens = append(t.maxTokens, maxTokens)
	t.mu.Unlock()
	n := len(dst)
	for _, b := range req.Messages {
		if maxTokens > 0 && len(dst)-n == maxTokens {
			break
		}
		dst = append(dst, uint32(b))
	}
	return dst, nil
}

// idCheckPolicy is least-load that checks the token ids Routed sees are the ids Pick
// saw for the same request.
type idCheckPolicy struct {
	scoring.LeastLoad
	mu       sync.Mutex
	seen     map[string]string
	problems []string
}

func (p *idCheckPolicy) Pick(r *scoring.Request, c []scoring.Endpoint) (scoring.Decision, error) {
	p.mu.Lock()
	p.seen[r.ID] = idString(r.TokenIDs)
	p.mu.Unlock()
	return p.LeastLoad.Pick(r, c)
}

func (p *idCheckPolicy) Routed(r *scoring.Request, _ string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if got := idString(r.TokenIDs); got != p.seen[r.ID] {
		p.problems = append(p.problems, r.ID+": Routed saw "+got+", Pick saw "+p.seen[r.ID])
	}
}

func (p *idCheckPolicy) FirstToken(string) {}
func (p *idCheckPolicy) Finished(string)   {}

func idString(ids []uint32) string {
	b := make([]byte, len(ids))
	for i, id := range ids {
		b[i] = byte(id)
	}
	return string(b)
}
