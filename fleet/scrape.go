package fleet

import (
	"context"
	"errors"
	"fmt"
	"hash/fnv"
	"io"
	"net/http"
	"sync"
	"time"

	"go.uber.org/zap"
	"golang.org/x/sync/errgroup"

	"github.com/kvrouter/kvrouter/scoring"
)

// Run scrapes each endpoint that has a metrics URL in its own loop (at once, then every
// scrape interval), so that a slow or dead endpoint delays no other. Loops start and stop
// as endpoints are added, changed or removed. Run returns nil once ctx ends and every
// loop has stopped.
func (f *Fleet) Run(ctx context.Context) error {
	changed := make(chan struct{}, 1)
	unsubscribe := f.Subscribe(func(c Change) {
		if c.Kind != StateChanged {
			select {
			case changed <- struct{}{}:
			default:
			}
		}
	})
	defer unsubscribe()

	type loop struct {
		url    string
		cancel context.CancelFunc
	}
	loops := map[*endpoint]loop{}
	var wg sync.WaitGroup
	defer wg.Wait()
	reconcile := func() {
		live := map[*endpoint]bool{}
		for _, ep := range f.table.Load().all {
			url := ep.cfg.Load().MetricsURL
			if url == "" {
				continue
			}
			live[ep] = true
			if l, ok := loops[ep]; ok && l.url == url {
				continue
			} else if ok {
				l.cancel()
			}
			lctx, cancel := context.WithCancel(ctx)
			loops[ep] = loop{url: url, cancel: cancel}
			wg.Go(func() { f.scrapeLoop(lctx, ep) })
		}
		for ep, l := range loops {
			if !live[ep] {
				l.cancel()
				delete(loops, ep)
			}
		}
	}
	reconcile()
	for {
		select {
		case <-ctx.Done():
			for _, l := range loops {
				l.cancel()
			}
			return nil
		case <-changed:
			reconcile()
		}
	}
}

func (f *Fleet) scrapeLoop(ctx context.Context, ep *endpoint) {
	// The first scrape is at once; after it each endpoint keeps its own phase within
	// the interval, as Prometheus spreads its targets: endpoints that join together
	// (all of them, at start) would otherwise be scraped in one burst every interval,
	// and the burst's CPU shows in the decision latency's tail.
	f.scrapeOne(ctx, ep)
	phase := time.NewTimer(scrapeOffset(ep.addr, f.scrape.Interval))
	select {
	case <-ctx.Done():
		phase.Stop()
		return
	case <-phase.C:
	}
	tick := time.NewTicker(f.scrape.Interval)
	defer tick.Stop()
	for {
		f.scrapeOne(ctx, ep)
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// scrapeOffset is addr's phase in [0, interval): a hash of the address, so that one
// endpoint keeps its phase across restarts and a fleet's endpoints spread evenly.
func scrapeOffset(addr string, interval time.Duration) time.Duration {
	if interval <= 0 {
		return 0
	}
	h := fnv.New64a()
	_, _ = h.Write([]byte(addr))
	return time.Duration(h.Sum64() % uint64(interval))
}

// ScrapeAll scrapes every endpoint that has a metrics URL once, concurrently (at most
// Options.ScrapeConcurrency at a time), and returns when all scrapes ended: one
// deterministic round, for tests and tools. Run scrapes on its own.
func (f *Fleet) ScrapeAll(ctx context.Context) {
	var g errgroup.Group
	g.SetLimit(f.conc)
	for _, ep := range f.table.Load().all {
		if ctx.Err() != nil {
			break
		}
		if ep.cfg.Load().MetricsURL == "" {
			continue
		}
		g.Go(func() error {
			f.scrapeOne(ctx, ep)
			return nil
		})
	}
	_ = g.Wait()
}

// scrapeError is a failed scrape with the reason label it is counted under.
type scrapeError struct {
	reason string
	err    error
}

func (e *scrapeError) Error() string { return e.err.Error() }

func (f *Fleet) scrapeOne(ctx context.Context, ep *endpoint) {
	ep.scraping.Lock()
	defer ep.scraping.Unlock()
	cfg := ep.cfg.Load()
	start := time.Now()
	started := f.now() // on the fleet's clock, to compare with a passive signal's time
	m, err := f.fetch(ctx, cfg)
	if f.metrics != nil {
		f.metrics.duration.Observe(time.Since(start).Seconds())
	}
	if ctx.Err() != nil && err != nil {
		return // shutting down: not the endpoint's fault
	}
	if f.table.Load().byAddr[ep.addr] != ep {
		return // removed meanwhile
	}
	prev := State(ep.state.Load())
	next := prev
	reason := ""
	if err == nil {
		ep.last.Store(&sample{m: m, at: f.now()})
		ep.failures.Store(0)
		next = StateHealthy
		if prev == StateSuspect && started.UnixNano() < ep.suspectAt.Load() {
			next = prev // began before the passive signal: proves nothing about it
		}
	} else {
		var se *scrapeError
		reason = "other"
		if errors.As(err, &se) {
			reason = se.reason
		}
		if f.metrics != nil {
			f.metrics.scrapeErrors.WithLabelValues(ep.addr, reason).Inc()
		}
		if n := ep.failures.Add(1); int(n) >= f.scrape.FailuresBeforeIneligible {
			next = StateUnhealthy
		}
		if prev == StateHealthy && next == StateUnhealthy {
			f.log.Warn("endpoint ineligible: metrics scrapes failing", zap.String("endpoint", ep.addr),
				zap.Int32("failures", ep.failures.Load()), zap.Error(err))
		}
	}
	if next == prev {
		if prev == StateHealthy && reason == "connect" {
			// Refused or unreachable: the process or its pod is gone, as a passive
			// signal says, without waiting for FailuresBeforeIneligible scrapes.
			f.ReportFailure(ep.addr, SignalScrape)
		}
		return
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.table.Load().byAddr[ep.addr] != ep || !ep.state.CompareAndSwap(int32(prev), int32(next)) {
		return
	}
	if next == StateHealthy {
		f.log.Info("endpoint eligible", zap.String("endpoint", ep.addr), zap.Stringer("was", prev))
	}
	f.notify(Change{Kind: StateChanged, Address: ep.addr, Endpoint: *ep.cfg.Load(), State: next, Ready: !ep.unready.Load()})
}

func (f *Fleet) fetch(ctx context.Context, cfg *EndpointConfig) (scoring.Metrics, error) {
	ctx, cancel := context.WithTimeout(ctx, f.scrape.Timeout)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, cfg.MetricsURL, nil)
	if err != nil {
		return scoring.Metrics{}, &scrapeError{"request", err}
	}
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	// Uncompressed: Go's transport would otherwise ask for gzip, and a gzip reader per
	// scrape (every endpoint, every interval) costs the router more CPU than parsing the
	// page; in-cluster bandwidth is cheap. A server that compresses anyway is still
	// read (Content-Encoding is then honoured by the transport only if it asked).
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := f.client.Do(req)
	if err != nil {
		reason := "connect"
		if errors.Is(err, context.DeadlineExceeded) {
			reason = "timeout"
		}
		return scoring.Metrics{}, &scrapeError{reason, err}
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 4<<10))
		return scoring.Metrics{}, &scrapeError{"status", fmt.Errorf("fleet: GET %s: HTTP %d", cfg.MetricsURL, resp.StatusCode)}
	}
	body, err := io.ReadAll(io.LimitReader(resp.Body, f.scrape.MaxBytes+1))
	if err != nil {
		reason := "read"
		if errors.Is(err, context.DeadlineExceeded) {
			reason = "timeout"
		}
		return scoring.Metrics{}, &scrapeError{reason, err}
	}
	if int64(len(body)) > f.scrape.MaxBytes {
		return scoring.Metrics{}, &scrapeError{"too_large", fmt.Errorf("fleet: GET %s: body over %d bytes", cfg.MetricsURL, f.scrape.MaxBytes)}
	}
	m, err := parseMetrics(body, cfg.Models)
	if err != nil {
		var pe *ParseError
		reason := "parse"
		if errors.As(err, &pe) {
			reason = "parse_" + pe.Reason
		}
		return scoring.Metrics{}, &scrapeError{reason, err}
	}
	return m, nil
}
