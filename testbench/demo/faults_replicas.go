package demo

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/kvrouter/kvrouter/peersync"
	"github.com/kvrouter/kvrouter/testbench/kvbench"
)

// ReplicaFaultOptions size the replica fault suite (issue 13): Options describe the stack
// (Routers kvrouter replicas sharing state, the first policy) and each phase's load.
type ReplicaFaultOptions struct {
	Options
	Process ProcessOptions
	// KillAfter is how far into its load a replica is killed or restarted.
	KillAfter time.Duration
	// Partition is how long the partition lasts: longer than the expiry and memberlist's
	// failure detection, so that each side routes on its own view for a while.
	Partition time.Duration
}

// DefaultReplicaFaultOptions is `make faults`' replica part: 3 servers, 3 replicas
// running placement (the policy that shares state), 96 requests per phase.
func DefaultReplicaFaultOptions() ReplicaFaultOptions {
	o := DefaultOptions()
	o.Workers, o.Routers, o.Policies, o.Requests, o.Concurrency, o.Prefixes = 3, 3, []string{"placement"}, 96, 6, 6
	return ReplicaFaultOptions{Options: o, KillAfter: 500 * time.Millisecond, Partition: 8 * time.Second}
}

// ShortReplicaFaultOptions is the version TestReplicaFaultsShort runs.
func ShortReplicaFaultOptions() ReplicaFaultOptions {
	f := DefaultReplicaFaultOptions()
	f.Requests, f.Prefixes, f.Partition = 36, 3, 5*time.Second
	return f
}

// ReplicaFaultResult is one phase's row.
type ReplicaFaultResult struct {
	Fault string `json:"fault"`
	// Requests were sent through the gateway during the phase's load, Failed of them
	// did not get a 200; CachedRatio is its cached-token ratio (each phase sends a new
	// seed's prefixes, so no phase starts warm on another's).
	Requests    int     `json:"requests"`
	Failed      int     `json:"failed"`
	CachedRatio float64 `json:"cached_ratio"`
	// AfterRatio is the partition's load sent after the heal (nil for other faults).
	AfterRatio *float64 `json:"after_ratio,omitempty"`
	// PhantomRequests are the killed replica's requests in flight that the survivors
	// counted when it was killed; GoneAfterMS is the time from the kill until no survivor
	// counts its state (forgotten or expired); -1: not within the bound.
	PhantomRequests int      `json:"phantom_requests,omitempty"`
	GoneAfterMS     *float64 `json:"gone_after_ms,omitempty"`
	// ReadyAfterMS and CaughtUpAfterMS are, for a restarted replica, the time from its
	// process start until its /readyz answers 200, and until it holds a live snapshot of
	// every peer and every peer holds its new incarnation; -1: not within the bound.
	ReadyAfterMS    *float64 `json:"ready_after_ms,omitempty"`
	CaughtUpAfterMS *float64 `json:"caught_up_after_ms,omitempty"`
	// SplitAfterMS is, in a partition, the time from the cut until no replica counts a
	// state from across it; HealedAfterMS from the heal until every replica holds a live
	// snapshot of every other; -1: not within the bound.
	SplitAfterMS  *float64 `json:"split_after_ms,omitempty"`
	HealedAfterMS *float64 `json:"healed_after_ms,omitempty"`
	Note          string   `json:"note,omitempty"`
}

// ReplicaFaultReport is what `kvdemo faults --replicas --json` writes
// (docs/data/replicas/faults.json).
type ReplicaFaultReport struct {
	Workers     int    `json:"workers"`
	Routers     int    `json:"routers"`
	Requests    int    `json:"requests_per_phase"`
	Concurrency int    `json:"concurrency"`
	Policy      string `json:"policy"`
	// ExpiryMS and JoinIntervalMS are the replicas' peersync settings (the defaults).
	ExpiryMS       float64              `json:"expiry_ms"`
	JoinIntervalMS float64              `json:"join_interval_ms"`
	PartitionMS    float64              `json:"partition_ms"`
	Short          bool                 `json:"short"`
	Rows           []ReplicaFaultResult `json:"rows"`
}

// replicaBound bounds every wait of the replica faults.
const replicaBound = 30 * time.Second

// RunReplicaFaults starts one stack of Routers replicas (each replica's gossip behind a
// peerProxy) and runs, each under load through the gateway: no fault (the reference),
// the last replica killed (SIGKILL), the last replica restarted (SIGTERM, then started
// again), and a partition cutting the last replica off from the others. Every loop is
// bounded; all traffic goes to 127.0.0.1.
func RunReplicaFaults(ctx context.Context, fo ReplicaFaultOptions) (_ ReplicaFaultReport, err error) {
	o := &fo.Options
	def := peersync.DefaultConfig()
	rep := ReplicaFaultReport{Workers: o.Workers, Routers: o.routers(), Requests: o.Requests, Concurrency: o.Concurrency,
		ExpiryMS: ms(def.Expiry), JoinIntervalMS: ms(def.JoinInterval), PartitionMS: ms(fo.Partition)}
	if o.routers() < 2 || o.Unsynced {
		return rep, errors.New("demo: replica faults need at least 2 replicas sharing state")
	}
	if len(o.Policies) == 0 {
		return rep, errors.New("demo: a policy is required")
	}
	rep.Policy = o.Policies[0]
	if _, _, err := o.workload(); err != nil { // validates and loads the tokenizer once
		return rep, err
	}
	po := fo.Process
	po.peerProxies = true
	s, target, err := startFaultStack(ctx, o, po, rep.Policy)
	if err != nil {
		return rep, err
	}
	defer func() {
		if cerr := s.Close(); err == nil && cerr != nil {
			err = cerr
		}
	}()
	victim := len(s.routers) - 1
	seed := o.Seed
	// load sends the next seed's workload (fresh prefixes) and summarises it.
	load := func() (kvbench.Summary, error) {
		oc := *o
		oc.Seed = seed
		seed++
		w, wl, err := oc.workload()
		if err != nil {
			return kvbench.Summary{}, err
		}
		run, err := target.Run(ctx, w, o.Concurrency, nil)
		if err != nil {
			return kvbench.Summary{}, err
		}
		return kvbench.Summarize(run.Results, kvbench.SummaryInput{PrefixTokens: wl.PrefixTokens, BlockSize: run.BlockSize}), nil
	}
	row := func(name string, sum kvbench.Summary) ReplicaFaultResult {
		r := ReplicaFaultResult{Fault: name, Requests: sum.Requests, Failed: sum.Errors, CachedRatio: sum.CachedRatio}
		if sum.FirstError != "" {
			r.Note = "first failure: " + sum.FirstError
		}
		return r
	}
	type phase struct {
		name string
		run  func() (ReplicaFaultResult, error)
	}
	phases := []phase{
		{"no fault", func() (ReplicaFaultResult, error) {
			sum, err := load()
			return row("no fault", sum), err
		}},
		{"replica killed", func() (ReplicaFaultResult, error) {
			return killReplica(ctx, s, victim, fo.KillAfter, load, row)
		}},
		{"replica restarted", func() (ReplicaFaultResult, error) {
			return restartReplica(ctx, s, victim, fo.KillAfter, load, row)
		}},
		{"partition", func() (ReplicaFaultResult, error) {
			return partitionReplica(ctx, s, victim, fo.Partition, def.Expiry, load, row)
		}},
	}
	for _, ph := range phases {
		// Every replica ready and holding every other's state before each phase.
		if err := waitReady(ctx, s, o.Workers, 60*time.Second); err != nil {
			return rep, fmt.Errorf("demo: before %s: %w", ph.name, err)
		}
		o.logf("replica fault: %s", ph.name)
		r, err := ph.run()
		if err != nil {
			return rep, fmt.Errorf("demo: %s: %w", ph.name, err)
		}
		o.logf("replica fault: %s: %d/%d failed, cached-token ratio %.3f %s", ph.name, r.Failed, r.Requests, r.CachedRatio, r.Note)
		rep.Rows = append(rep.Rows, r)
	}
	return rep, nil
}

// msp is d in milliseconds, or -1 when !ok.
func msp(d time.Duration, ok bool) *float64 {
	v := -1.0
	if ok {
		v = ms(d)
	}
	return &v
}

// waitFor polls cond every 10 ms until it holds (true, the time taken) or bound passes.
func waitFor(ctx context.Context, bound time.Duration, cond func() bool) (time.Duration, bool) {
	t0 := time.Now()
	for time.Since(t0) < bound && ctx.Err() == nil {
		if cond() {
			return time.Since(t0), true
		}
		sleep(ctx, 10*time.Millisecond)
	}
	return time.Since(t0), false
}

// peer is what one replica's /debug/replicas says of another.
type peer struct {
	held     bool   // its state is held (absent: never heard, or forgotten when memberlist saw it leave or die)
	live     bool   // and counts (heard within the expiry)
	inc      uint64 // its incarnation
	requests int    // its requests in flight, over every endpoint
}

// peerView is what replica r's /debug/replicas says of the peer named name; ok is false
// when the view could not be read.
func peerView(ctx context.Context, r routerProc, name string) (peer, bool) {
	var v replicasView
	if json.Unmarshal([]byte(get(ctx, r.debug+"/debug/replicas")), &v) != nil {
		return peer{}, false
	}
	for _, p := range v.Peers {
		if p.Name != name {
			continue
		}
		out := peer{held: true, live: p.Live, inc: p.Incarnation}
		for _, l := range p.Loads {
			var el struct{ Requests int }
			if json.Unmarshal(l, &el) == nil {
				out.requests += el.Requests
			}
		}
		return out, true
	}
	return peer{}, true
}

// gossipName is replica i's name among its peers (replicasSection).
func gossipName(i int) string { return fmt.Sprintf("kvrouter-%d", i) }

// others are the replicas other than i.
func others(s *procStack, i int) []routerProc {
	out := slices.Clone(s.routers)
	return slices.Delete(out, i, i+1)
}

// loadWith runs load on a goroutine and inject beside it, then waits for the load.
func loadWith(load func() (kvbench.Summary, error), inject func() error) (kvbench.Summary, error) {
	type out struct {
		sum kvbench.Summary
		err error
	}
	done := make(chan out, 1)
	go func() {
		sum, err := load()
		done <- out{sum, err}
	}()
	ierr := inject()
	lo := <-done
	return lo.sum, errors.Join(lo.err, ierr)
}

// killReplica SIGKILLs replica victim KillAfter into the load and measures how long the
// survivors count its state; it then starts the replica again (not measured).
func killReplica(ctx context.Context, s *procStack, victim int, after time.Duration, load func() (kvbench.Summary, error),
	row func(string, kvbench.Summary) ReplicaFaultResult) (ReplicaFaultResult, error) {
	name := gossipName(victim)
	var phantom int
	var how []string
	var gone time.Duration
	var goneOK bool
	sum, err := loadWith(load, func() error {
		sleep(ctx, after)
		for _, r := range others(s, victim) {
			if p, _ := peerView(ctx, r, name); p.requests > 0 {
				phantom += p.requests
			}
		}
		if err := s.stop(s.routers[victim].name, syscall.SIGKILL); err != nil {
			return err
		}
		gone, goneOK = waitFor(ctx, replicaBound, func() bool {
			how = how[:0]
			for _, r := range others(s, victim) {
				p, ok := peerView(ctx, r, name)
				if !ok || p.live {
					return false
				}
				if p.held {
					how = append(how, r.name+": expired")
				} else {
					how = append(how, r.name+": forgotten (memberlist saw it die)")
				}
			}
			return true
		})
		return nil
	})
	if err != nil {
		return ReplicaFaultResult{}, err
	}
	r := row("replica killed", sum)
	r.PhantomRequests, r.GoneAfterMS = phantom, msp(gone, goneOK)
	if goneOK {
		r.Note = strings.TrimSuffix(strings.Join(how, ", ")+"; "+r.Note, "; ")
	}
	return r, s.respawn(s.routers[victim].name)
}

// restartReplica stops replica victim (SIGTERM: it drains) KillAfter into the load,
// starts it again at once and measures how long until it is ready and its shared state
// is caught up both ways.
func restartReplica(ctx context.Context, s *procStack, victim int, after time.Duration, load func() (kvbench.Summary, error),
	row func(string, kvbench.Summary) ReplicaFaultResult) (ReplicaFaultResult, error) {
	name, self := gossipName(victim), s.routers[victim]
	var ready, caught time.Duration
	var readyOK, caughtOK bool
	sum, err := loadWith(load, func() error {
		sleep(ctx, after)
		old, _ := peerView(ctx, others(s, victim)[0], name)
		if err := s.stop(self.name, syscall.SIGTERM); err != nil {
			return err
		}
		if err := s.respawn(self.name); err != nil {
			return err
		}
		t0 := time.Now()
		// Both conditions are polled together from the start, each timed on its own.
		var readyAt, caughtAt time.Duration
		_, _ = waitFor(ctx, replicaBound, func() bool {
			if !readyOK && strings.Contains(getStatus(ctx, self.metricsURL+"/readyz"), "200") {
				readyAt, readyOK = time.Since(t0), true
			}
			if !caughtOK && caughtUp(ctx, s, victim, old.inc) {
				caughtAt, caughtOK = time.Since(t0), true
			}
			return readyOK && caughtOK
		})
		ready, caught = readyAt, caughtAt
		return nil
	})
	if err != nil {
		return ReplicaFaultResult{}, err
	}
	r := row("replica restarted", sum)
	r.ReadyAfterMS, r.CaughtUpAfterMS = msp(ready, readyOK), msp(caught, caughtOK)
	return r, nil
}

// caughtUp reports whether replica victim holds a live snapshot of every peer and every
// peer holds a live snapshot of its incarnation newer than oldInc.
func caughtUp(ctx context.Context, s *procStack, victim int, oldInc uint64) bool {
	name := gossipName(victim)
	for i, r := range s.routers {
		if i == victim {
			continue
		}
		if p, ok := peerView(ctx, s.routers[victim], gossipName(i)); !ok || !p.live {
			return false
		}
		if p, ok := peerView(ctx, r, name); !ok || !p.live || p.inc <= oldInc {
			return false
		}
	}
	return true
}

// getStatus returns url's HTTP status line ("" when it did not answer).
func getStatus(ctx context.Context, url string) string {
	rctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	req, err := http.NewRequestWithContext(rctx, http.MethodGet, url, nil)
	if err != nil {
		return ""
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return ""
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.Status
}

// partitionReplica cuts replica victim off from the others (UDP dropped both ways, TCP
// refused) for d; the load starts once each side's view of the other has expired and so
// measures routing on split views; after the heal, a second load measures the ratio
// again.
func partitionReplica(ctx context.Context, s *procStack, victim int, d, expiry time.Duration, load func() (kvbench.Summary, error),
	row func(string, kvbench.Summary) ReplicaFaultResult) (ReplicaFaultResult, error) {
	t0 := time.Now()
	s.partition.cut.Store(&map[int]bool{victim: true})
	for _, p := range s.proxies {
		p.cutStreams()
	}
	split, splitOK := waitFor(ctx, replicaBound, func() bool { return !anyCrossView(ctx, s, victim) })
	sleep(ctx, expiry-time.Since(t0)) // at least the expiry into the partition
	sum, err := load()
	if err != nil {
		s.partition.cut.Store(nil)
		return ReplicaFaultResult{}, err
	}
	sleep(ctx, d-time.Since(t0))
	s.partition.cut.Store(nil)
	healed, healedOK := waitFor(ctx, replicaBound, func() bool { return allLive(ctx, s) })
	var dropped int64
	for _, p := range s.proxies {
		dropped += p.dropped.Load()
	}
	r := row("partition", sum)
	r.SplitAfterMS, r.HealedAfterMS = msp(split, splitOK), msp(healed, healedOK)
	r.Note = strings.TrimPrefix(fmt.Sprintf("%s; %d gossip packets dropped across the cut", r.Note, dropped), "; ")
	after, err := load()
	if err != nil {
		return r, err
	}
	r.AfterRatio = &after.CachedRatio
	if after.Errors > 0 {
		r.Note += fmt.Sprintf("; %d of %d failed after the heal", after.Errors, after.Requests)
	}
	return r, nil
}

// anyCrossView reports whether a replica on one side still counts a state from the other.
func anyCrossView(ctx context.Context, s *procStack, victim int) bool {
	for i, r := range s.routers {
		for j := range s.routers {
			if i == j || (i == victim) == (j == victim) {
				continue
			}
			if p, ok := peerView(ctx, r, gossipName(j)); !ok || p.live {
				return true
			}
		}
	}
	return false
}

// allLive reports whether every replica holds a live snapshot of every other.
func allLive(ctx context.Context, s *procStack) bool {
	for _, r := range s.routers {
		live, ok := livePeers(ctx, r.debug)
		if !ok || len(live) < len(s.routers)-1 {
			return false
		}
	}
	return true
}

// WriteReplicaFaults prints the replica fault table.
func WriteReplicaFaults(w io.Writer, rep ReplicaFaultReport) error {
	if len(rep.Rows) == 0 {
		return errNoRows
	}
	f := func(p *float64) string {
		if p == nil {
			return "-"
		}
		return fmt.Sprintf("%.0f", *p)
	}
	fmt.Fprintf(w, "%d replicas (policy %s, expiry %.0f ms) over %d servers; %d requests at concurrency %d per phase\n",
		rep.Routers, rep.Policy, rep.ExpiryMS, rep.Workers, rep.Requests, rep.Concurrency)
	fmt.Fprintf(w, "%-18s %8s %7s %6s %8s %9s %8s %9s %8s %8s  %s\n", "fault", "failed", "ratio", "after", "phantom", "gone ms",
		"ready ms", "caught ms", "split ms", "heal ms", "note")
	for _, r := range rep.Rows {
		after := "-"
		if r.AfterRatio != nil {
			after = fmt.Sprintf("%.3f", *r.AfterRatio)
		}
		fmt.Fprintf(w, "%-18s %8s %7.3f %6s %8d %9s %8s %9s %8s %8s  %s\n", r.Fault, fmt.Sprintf("%d/%d", r.Failed, r.Requests),
			r.CachedRatio, after, r.PhantomRequests, f(r.GoneAfterMS), f(r.ReadyAfterMS), f(r.CaughtUpAfterMS), f(r.SplitAfterMS),
			f(r.HealedAfterMS), r.Note)
	}
	return nil
}
