package discovery_test

import (
	"net/netip"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/kvrouter/kvrouter/discovery"
	"github.com/kvrouter/kvrouter/fleet"
)

const qwen = "Qwen/Qwen3-0.6B"

// fakeNow is a settable clock.
type fakeNow struct{ t time.Time }

func (c *fakeNow) Now() time.Time          { return c.t }
func (c *fakeNow) Advance(d time.Duration) { c.t = c.t.Add(d) }

func newFleet(t *testing.T) *fleet.Fleet {
	t.Helper()
	f, err := newFleetB()
	if err != nil {
		t.Fatal(err)
	}
	return f
}

func newFleetB() (*fleet.Fleet, error) {
	return fleet.New(fleet.Config{Scrape: fleet.DefaultScrapeConfig()}, fleet.Options{})
}

func targetCfg() discovery.TargetConfig {
	return discovery.TargetConfig{Port: 8000, Models: []string{qwen}, MetricsPath: "-", UnreadyGrace: 30 * time.Second}
}

func pod(id, ip string, ready bool) discovery.Target {
	return discovery.Target{ID: id, IP: netip.MustParseAddr(ip), Port: 8000, Ready: ready, Rank: -1}
}

// view is the fleet as a test sees it: eligible addresses and held-out ones.
func view(f *fleet.Fleet) (eligible, held []string) {
	for _, s := range f.Status() {
		if s.Ready {
			eligible = append(eligible, s.Config.Address)
		} else {
			held = append(held, s.Config.Address)
		}
	}
	return eligible, held
}

func TestReconciler(t *testing.T) {
	type step struct {
		name     string
		advance  time.Duration
		targets  []discovery.Target // nil with expire: only Expire
		expire   bool
		eligible []string
		held     []string
		removed  []string // Removed notifications during the step
	}
	steps := []step{
		{name: "pods come, unready one ignored",
			targets:  []discovery.Target{pod("ns/a", "10.0.0.1", true), pod("ns/b", "10.0.0.2", true), pod("ns/c", "10.0.0.3", false)},
			eligible: []string{"10.0.0.1:8000", "10.0.0.2:8000"}},
		{name: "unready pod held out at once, kept",
			targets:  []discovery.Target{pod("ns/a", "10.0.0.1", false), pod("ns/b", "10.0.0.2", true), pod("ns/c", "10.0.0.3", true)},
			eligible: []string{"10.0.0.2:8000", "10.0.0.3:8000"}, held: []string{"10.0.0.1:8000"}},
		{name: "flaps back within the grace, KV state kept", advance: 29 * time.Second,
			targets:  []discovery.Target{pod("ns/a", "10.0.0.1", true), pod("ns/b", "10.0.0.2", true), pod("ns/c", "10.0.0.3", true)},
			eligible: []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}},
		{name: "unready again: the grace starts over",
			targets:  []discovery.Target{pod("ns/a", "10.0.0.1", false), pod("ns/b", "10.0.0.2", true), pod("ns/c", "10.0.0.3", true)},
			eligible: []string{"10.0.0.2:8000", "10.0.0.3:8000"}, held: []string{"10.0.0.1:8000"}},
		{name: "grace not over yet", advance: 29 * time.Second, expire: true,
			eligible: []string{"10.0.0.2:8000", "10.0.0.3:8000"}, held: []string{"10.0.0.1:8000"}},
		{name: "grace over: removed", advance: time.Second, expire: true,
			eligible: []string{"10.0.0.2:8000", "10.0.0.3:8000"}, removed: []string{"10.0.0.1:8000"}},
		{name: "expired pod ready again joins as new",
			targets:  []discovery.Target{pod("ns/a", "10.0.0.1", true), pod("ns/b", "10.0.0.2", true), pod("ns/c", "10.0.0.3", true)},
			eligible: []string{"10.0.0.1:8000", "10.0.0.2:8000", "10.0.0.3:8000"}},
		{name: "deleted pod removed at once",
			targets:  []discovery.Target{pod("ns/a", "10.0.0.1", true), pod("ns/c", "10.0.0.3", true)},
			eligible: []string{"10.0.0.1:8000", "10.0.0.3:8000"}, removed: []string{"10.0.0.2:8000"}},
		{name: "changed IP: old address removed at once, new one added",
			targets:  []discovery.Target{pod("ns/a", "10.0.0.9", true), pod("ns/c", "10.0.0.3", true)},
			eligible: []string{"10.0.0.3:8000", "10.0.0.9:8000"}, removed: []string{"10.0.0.1:8000"}},
		{name: "address freed and taken by another pod in one update",
			targets:  []discovery.Target{pod("ns/a", "10.0.0.9", true), pod("ns/d", "10.0.0.3", true)},
			eligible: []string{"10.0.0.3:8000", "10.0.0.9:8000"}, removed: []string{"10.0.0.3:8000"}},
		{name: "bad annotation: held out like an unready pod",
			targets: []discovery.Target{
				{ID: "ns/a", IP: netip.MustParseAddr("10.0.0.9"), Port: 8000, Ready: true, Rank: -1,
					Annotations: map[string]string{discovery.AnnotationDataParallelSize: "zero"}},
				pod("ns/d", "10.0.0.3", true)},
			eligible: []string{"10.0.0.3:8000"}, held: []string{"10.0.0.9:8000"}},
		{name: "everything gone",
			targets: []discovery.Target{},
			removed: []string{"10.0.0.3:8000", "10.0.0.9:8000"}},
	}
	clk := &fakeNow{t: time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)}
	f := newFleet(t)
	var removed []string
	f.Subscribe(func(c fleet.Change) {
		if c.Kind == fleet.Removed {
			removed = append(removed, c.Address)
		}
	})
	reg := prometheus.NewRegistry()
	r := discovery.NewReconciler("test", f, targetCfg(), discovery.DefaultKVEventsConfig(),
		discovery.ReconcilerOptions{Now: clk.Now, Metrics: discovery.NewMetrics(reg)})
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			removed = nil
			clk.Advance(s.advance)
			if s.expire {
				r.Expire()
			} else {
				r.Apply(s.targets)
			}
			el, held := view(f)
			if !slices.Equal(el, s.eligible) || !slices.Equal(held, s.held) {
				t.Errorf("fleet: eligible %v held %v; want %v and %v", el, held, s.eligible, s.held)
			}
			eps, _, _, _ := f.Candidates(qwen)
			if len(eps) != len(s.eligible) {
				t.Errorf("Candidates: %d endpoints, want %d", len(eps), len(s.eligible))
			}
			slices.Sort(removed)
			if !slices.Equal(removed, s.removed) {
				t.Errorf("removed %v, want %v", removed, s.removed)
			}
			rr, ru := r.Endpoints()
			if !slices.Equal(rr, s.eligible) || !slices.Equal(ru, s.held) {
				t.Errorf("Endpoints() = %v, %v", rr, ru)
			}
		})
	}
	t.Run("metrics", func(t *testing.T) {
		want := `
# HELP kvrouter_discovery_changes_total Fleet changes made by discovery, by source and kind (added, updated, unready, ready, removed, expired).
# TYPE kvrouter_discovery_changes_total counter
kvrouter_discovery_changes_total{kind="added",source="test"} 6
kvrouter_discovery_changes_total{kind="expired",source="test"} 1
kvrouter_discovery_changes_total{kind="ready",source="test"} 1
kvrouter_discovery_changes_total{kind="removed",source="test"} 5
kvrouter_discovery_changes_total{kind="unready",source="test"} 3
# HELP kvrouter_discovery_errors_total Targets skipped and failed look-ups, by source and reason.
# TYPE kvrouter_discovery_errors_total counter
kvrouter_discovery_errors_total{reason="target",source="test"} 1
# HELP kvrouter_discovery_targets Endpoints discovery holds in the fleet, by source and state (ready, unready: held out during the grace).
# TYPE kvrouter_discovery_targets gauge
kvrouter_discovery_targets{source="test",state="ready"} 0
kvrouter_discovery_targets{source="test",state="unready"} 0
`
		if err := testutil.GatherAndCompare(reg, strings.NewReader(want)); err != nil {
			t.Error(err)
		}
	})
}

func TestReconcilerZeroGrace(t *testing.T) {
	f := newFleet(t)
	tc := targetCfg()
	tc.UnreadyGrace = 0
	r := discovery.NewReconciler("test", f, tc, discovery.DefaultKVEventsConfig(), discovery.ReconcilerOptions{})
	r.Apply([]discovery.Target{pod("ns/a", "10.0.0.1", true)})
	r.Apply([]discovery.Target{pod("ns/a", "10.0.0.1", false)})
	if st := f.Status(); len(st) != 0 {
		t.Errorf("with no grace an unready pod stays: %+v", st)
	}
}

func TestReconcilerUpdatesModels(t *testing.T) {
	f := newFleet(t)
	r := discovery.NewReconciler("test", f, targetCfg(), discovery.DefaultKVEventsConfig(), discovery.ReconcilerOptions{})
	a := pod("ns/a", "10.0.0.1", true)
	r.Apply([]discovery.Target{a})
	var kinds []fleet.ChangeKind
	f.Subscribe(func(c fleet.Change) { kinds = append(kinds, c.Kind) })
	a.Annotations = map[string]string{discovery.AnnotationModels: "m1, m2"}
	r.Apply([]discovery.Target{a})
	r.Apply([]discovery.Target{a})
	if !slices.Equal(kinds, []fleet.ChangeKind{fleet.Updated}) {
		t.Errorf("changes %v, want one update", kinds)
	}
	if got := f.Status()[0].Config.Models; !slices.Equal(got, []string{"m1", "m2"}) {
		t.Errorf("models %v", got)
	}
}
