package fleet_test

import (
	"bytes"
	"compress/gzip"
	"net/http"
	"net/http/httptest"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"text/template"
	"time"
)

// clock is a hand-set clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

// load is what the fake vLLM reports.
type load struct {
	Running, Waiting int
	Usage            float64
	Blocks           int
}

// fakeVLLM serves /metrics rendered from testdata/vllm-metrics.txt, a real vLLM
// exposition, with settable figures; it can be told to fail.
type fakeVLLM struct {
	*httptest.Server
	tmpl *template.Template

	mu     sync.Mutex
	load   load
	status int // 0: 200
	body   []byte
	hits   int
	accept []string     // Accept-Encoding of each scrape
	z      *gzip.Writer // reused, so that the fake's own compression costs little in benchmarks
	// hold, when set, runs before each scrape is answered (to hold it in flight).
	hold atomic.Pointer[func()]
}

func newFakeVLLM(t *testing.T, l load) *fakeVLLM {
	t.Helper()
	text, err := os.ReadFile("testdata/vllm-metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	f := &fakeVLLM{tmpl: template.Must(template.New("m").Parse(string(text))), load: l}
	f.Server = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.Close)
	return f
}

func (f *fakeVLLM) serve(w http.ResponseWriter, r *http.Request) {
	if h := f.hold.Load(); h != nil {
		(*h)()
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.hits++
	f.accept = append(f.accept, r.Header.Get("Accept-Encoding"))
	if r.URL.Path != "/metrics" {
		http.NotFound(w, r)
		return
	}
	if f.status != 0 {
		http.Error(w, "injected failure", f.status)
		return
	}
	if f.body != nil {
		_, _ = w.Write(f.body)
		return
	}
	var b bytes.Buffer
	if err := f.tmpl.Execute(&b, f.load); err != nil {
		http.Error(w, err.Error(), 500)
		return
	}
	w.Header().Set("Content-Type", "text/plain; version=0.0.4; charset=utf-8")
	if strings.Contains(r.Header.Get("Accept-Encoding"), "gzip") {
		// As vLLM's prometheus_client app does when the scraper accepts gzip.
		w.Header().Set("Content-Encoding", "gzip")
		if f.z == nil {
			f.z = gzip.NewWriter(w)
		} else {
			f.z.Reset(w)
		}
		_, _ = f.z.Write(b.Bytes())
		_ = f.z.Close()
		return
	}
	_, _ = w.Write(b.Bytes())
}

func (f *fakeVLLM) fail(status int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.status = status
}

func (f *fakeVLLM) serveBody(b []byte) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.body = b
}

func (f *fakeVLLM) metricsURL() string { return f.URL + "/metrics" }
