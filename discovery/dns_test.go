package discovery_test

import (
	"context"
	"errors"
	"net"
	"net/netip"
	"slices"
	"sync"
	"testing"
	"time"

	clocktesting "k8s.io/utils/clock/testing"

	"github.com/kvrouter/kvrouter/discovery"
	"github.com/kvrouter/kvrouter/internal/testwait"
)

// fakeResolver answers with whatever the test set last.
type fakeResolver struct {
	mu    sync.Mutex
	ips   []netip.Addr
	err   error
	calls int
}

func (r *fakeResolver) set(err error, ips ...string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.err, r.ips = err, nil
	for _, s := range ips {
		r.ips = append(r.ips, netip.MustParseAddr(s))
	}
}

func (r *fakeResolver) LookupNetIP(_ context.Context, network, host string) ([]netip.Addr, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.calls++
	if network != "ip" || host != "vllm.default.svc.cluster.local" {
		return nil, errors.New("unexpected question " + network + " " + host)
	}
	return slices.Clone(r.ips), r.err
}

func (r *fakeResolver) count() int {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.calls
}

func dnsCfg() discovery.DNSConfig {
	var c discovery.DNSConfig
	c.SetDefaults()
	c.Name = "vllm.default.svc.cluster.local"
	c.Port = 8000
	c.Models = []string{qwen}
	c.MetricsPath = "-"
	return c
}

func TestDNSSync(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	res := &fakeResolver{}
	f := newFleet(t)
	d, err := discovery.NewDNS(dnsCfg(), discovery.DefaultKVEventsConfig(), f, res, discovery.Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	notFound := &net.DNSError{Err: "no such host", Name: "vllm", IsNotFound: true}
	steps := []struct {
		name     string
		advance  time.Duration
		err      error
		ips      []string
		wantErr  bool
		eligible []string
		held     []string
	}{
		{name: "two pods", ips: []string{"10.0.0.2", "10.0.0.1", "10.0.0.1"}, eligible: []string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{name: "one leaves the answer: held out", ips: []string{"10.0.0.2"}, eligible: []string{"10.0.0.2:8000"}, held: []string{"10.0.0.1:8000"}},
		{name: "failed look-up keeps the last answer", advance: 10 * time.Second, err: errors.New("timeout"), wantErr: true,
			eligible: []string{"10.0.0.2:8000"}, held: []string{"10.0.0.1:8000"}},
		{name: "back within the grace", advance: 10 * time.Second, ips: []string{"10.0.0.1", "10.0.0.2"}, eligible: []string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{name: "name gone: every pod held out", err: notFound, held: []string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{name: "failed look-up still expires the grace", advance: 30 * time.Second, err: errors.New("servfail"), wantErr: true},
		{name: "new pod joins", ips: []string{"10.0.0.3"}, eligible: []string{"10.0.0.3:8000"}},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			clk.Step(s.advance)
			res.set(s.err, s.ips...)
			if err := d.Sync(context.Background()); (err != nil) != s.wantErr {
				t.Fatalf("Sync error %v, want error %v", err, s.wantErr)
			}
			el, held := view(f)
			if !slices.Equal(el, s.eligible) || !slices.Equal(held, s.held) {
				t.Errorf("fleet: eligible %v held %v; want %v and %v", el, held, s.eligible, s.held)
			}
		})
	}
}

func TestDNSRun(t *testing.T) {
	clk := clocktesting.NewFakeClock(time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC))
	res := &fakeResolver{}
	res.set(nil, "10.0.0.1")
	f := newFleet(t)
	d, err := discovery.NewDNS(dnsCfg(), discovery.DefaultKVEventsConfig(), f, res, discovery.Options{Clock: clk})
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- d.Run(ctx) }()
	testwait.For(t, "first look-up", func() bool { return len(f.Status()) == 1 })
	res.set(nil, "10.0.0.1", "10.0.0.2")
	testwait.For(t, "ticker armed", clk.HasWaiters)
	clk.Step(5 * time.Second)
	testwait.For(t, "second look-up", func() bool { return len(f.Status()) == 2 })
	cancel()
	if err := <-done; err != nil {
		t.Errorf("Run returned %v", err)
	}
	if n := res.count(); n != 2 {
		t.Errorf("%d look-ups, want 2", n)
	}
}
