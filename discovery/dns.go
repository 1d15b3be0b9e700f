package discovery

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"slices"
	"time"

	"go.uber.org/zap"
	"k8s.io/utils/clock"
)

// Resolver looks up a host's addresses; *net.Resolver is one.
type Resolver interface {
	LookupNetIP(ctx context.Context, network, host string) ([]netip.Addr, error)
}

// Options are a source's collaborators; every field may be left zero.
type Options struct {
	// Logger logs endpoint changes and failed look-ups. Nil: no logs.
	Logger *zap.Logger
	// Metrics counts changes and errors. Nil: not counted.
	Metrics *Metrics
	// Clock drives intervals and grace periods. Nil: the real clock.
	Clock clock.WithTicker
}

func (o *Options) fill() {
	if o.Logger == nil {
		o.Logger = zap.NewNop()
	}
	if o.Clock == nil {
		o.Clock = clock.RealClock{}
	}
}

// DNSSource is the dns discovery source: it resolves a headless Service's name every
// interval and feeds the addresses to a Reconciler. A failed look-up changes nothing
// (the last answer stands); a name that does not exist means no pods.
type DNSSource struct {
	cfg DNSConfig
	res Resolver
	rec *Reconciler
	o   Options
}

// SourceDNS names the dns source in metrics and logs.
const SourceDNS = "dns"

// NewDNS builds the source; it starts nothing (Run does). res nil: net.DefaultResolver.
func NewDNS(cfg DNSConfig, ev KVEventsConfig, reg Registry, res Resolver, o Options) (*DNSSource, error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("discovery: dns: %w", err)
	}
	if err := ev.Validate(); err != nil {
		return nil, fmt.Errorf("discovery: kv_events: %w", err)
	}
	o.fill()
	if res == nil {
		res = net.DefaultResolver
	}
	rec := NewReconciler(SourceDNS, reg, cfg.TargetConfig, ev, ReconcilerOptions{
		Logger: o.Logger, Metrics: o.Metrics, Now: o.Clock.Now, MissingIsUnready: true,
	})
	return &DNSSource{cfg: cfg, res: res, rec: rec, o: o}, nil
}

// Sync resolves the name once and applies the answer; on a failed look-up it only
// expires the grace periods that ended, and returns the error.
func (d *DNSSource) Sync(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, min(d.cfg.Interval, 10*time.Second))
	defer cancel()
	ips, err := d.res.LookupNetIP(ctx, "ip", d.cfg.Name)
	var dnsErr *net.DNSError
	if err != nil && !(errors.As(err, &dnsErr) && dnsErr.IsNotFound) {
		d.o.Metrics.Error(SourceDNS, "resolve")
		d.rec.Expire()
		return fmt.Errorf("discovery: dns: resolve %s: %w", d.cfg.Name, err)
	}
	targets := make([]Target, 0, len(ips))
	seen := map[netip.Addr]bool{}
	for _, ip := range ips {
		ip = ip.Unmap()
		if seen[ip] {
			continue
		}
		seen[ip] = true
		targets = append(targets, Target{ID: ip.String(), IP: ip, Port: uint16(d.cfg.Port), Ready: true, Rank: -1})
	}
	slices.SortFunc(targets, func(a, b Target) int { return a.IP.Compare(b.IP) })
	d.rec.Apply(targets)
	d.o.Metrics.Synced(SourceDNS)
	return nil
}

// Endpoints returns the addresses the source holds in the fleet.
func (d *DNSSource) Endpoints() (ready, unready []string) { return d.rec.Endpoints() }

// Run resolves now and then every interval until ctx ends; it returns nil then. An
// address gone from the answer is removed within one interval after its grace ends.
func (d *DNSSource) Run(ctx context.Context) error {
	t := d.o.Clock.NewTicker(d.cfg.Interval)
	defer t.Stop()
	for {
		if err := d.Sync(ctx); err != nil && ctx.Err() == nil {
			d.o.Logger.Warn("dns discovery: look-up failed; keeping the last answer", zap.Error(err))
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C():
		}
	}
}
