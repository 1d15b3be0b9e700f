package kvbench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"io"
	"testing"

	"github.com/kvrouter/kvrouter/scoring"
)

// TestRouteLogMatchesResults: every request of a run is logged once routed, with every
// server's state (where the request's blocks are cached included), once at its first
// token, with the server and TTFT its result has, and once at its finish, with its
// result's prompt and cached tokens; every line names the routing replica and the warmup.
func TestRouteLogMatchesResults(t *testing.T) {
	cfg := smallSim(&testFleet{})
	var buf bytes.Buffer
	cfg.RouteLog = NewRouteLog(&buf)
	w := simWorkload(t, 4, 40, 0)
	out, err := RunSim(context.Background(), cfg, w, "sticky", 4, 2)
	if err != nil {
		t.Fatal(err)
	}
	if err := cfg.RouteLog.Err(); err != nil {
		t.Fatal(err)
	}
	routed, first, finished := map[int]RouteEvent{}, map[int]RouteEvent{}, map[int]RouteEvent{}
	for _, ev := range routeEvents(t, &buf) {
		if ev.Policy != "sticky" || ev.Rep != 2 || ev.Concurrency != 4 {
			t.Fatalf("line names run %s rep %d C %d, want sticky rep 2 C 4", ev.Policy, ev.Rep, ev.Concurrency)
		}
		switch ev.Event {
		case "route":
			if _, dup := routed[ev.Seq]; dup {
				t.Fatalf("request %d routed twice", ev.Seq)
			}
			if len(ev.Servers) != len(cfg.Servers) {
				t.Fatalf("request %d: %d server states, want %d", ev.Seq, len(ev.Servers), len(cfg.Servers))
			}
			routed[ev.Seq] = ev
		case "first_token":
			if _, ok := routed[ev.Seq]; !ok {
				t.Fatalf("request %d: first token before it was routed", ev.Seq)
			}
			first[ev.Seq] = ev
		case "finish":
			if _, ok := first[ev.Seq]; !ok {
				t.Fatalf("request %d: finished before its first token", ev.Seq)
			}
			if _, dup := finished[ev.Seq]; dup {
				t.Fatalf("request %d finished twice", ev.Seq)
			}
			finished[ev.Seq] = ev
		default:
			t.Fatalf("unknown event %q", ev.Event)
		}
	}
	if len(routed) != len(out.Results) || len(first) != len(out.Results) || len(finished) != len(out.Results) {
		t.Fatalf("logged %d routed, %d first tokens, %d finished, want %d each", len(routed), len(first), len(finished), len(out.Results))
	}
	cached, cachedSomewhere := 0, false
	for _, r := range out.Results {
		rt, ft, fin := routed[r.Seq], first[r.Seq], finished[r.Seq]
		if fin.Server != rt.Server || fin.PromptTokens != r.PromptTokens || fin.CachedTokens != r.CachedTokens || fin.T < ft.T {
			t.Errorf("request %d: logged finish on %d with %d/%d cached at %.3f s, result on %s with %d/%d", r.Seq,
				fin.Server, fin.CachedTokens, fin.PromptTokens, fin.T, r.Server, r.CachedTokens, r.PromptTokens)
		}
		cached += fin.CachedTokens
		if cfg.Address(rt.Server) != r.Server || ft.Server != rt.Server || rt.Prefix != r.Prefix {
			t.Errorf("request %d: logged server %d/%d prefix %d, result %s prefix %d", r.Seq, rt.Server, ft.Server, rt.Prefix, r.Server, r.Prefix)
		}
		if rt.Warmup != r.Warmup || ft.Warmup != r.Warmup || fin.Warmup != r.Warmup || rt.Replica != 0 {
			t.Errorf("request %d: logged warmup %v/%v/%v, replica %d; result warmup %v", r.Seq, rt.Warmup, ft.Warmup, fin.Warmup, rt.Replica, r.Warmup)
		}
		for i, s := range rt.Servers {
			if s.CachedBlocks < 0 || s.CachedBlocks*cfg.Engine.BlockSize >= r.PromptTokens {
				t.Errorf("request %d: server %d caches %d of its blocks, prompt %d tokens", r.Seq, i, s.CachedBlocks, r.PromptTokens)
			}
			cachedSomewhere = cachedSomewhere || s.CachedBlocks > 0
		}
		if want := float64(r.TTFT.Microseconds()) / 1000; ft.TTFTMS < want-0.01 || ft.TTFTMS > want+0.01 || ft.T < rt.T {
			t.Errorf("request %d: logged TTFT %.3f ms at %.3f s (routed %.3f s), result %v", r.Seq, ft.TTFTMS, ft.T, rt.T, r.TTFT)
		}
	}
	if cached == 0 || !cachedSomewhere {
		t.Errorf("finishes logged %d cached tokens, a prefix logged cached somewhere: %v; the run's requests share prefixes", cached, cachedSomewhere)
	}
}

// TestRouteLogNamesDecisionKind: each route line names the kind of the decision that
// made it (scoring.Decision.Kind): the kv policy sends a prefix's first request by load
// and its repeats to a server holding its blocks; round-robin logs its turn.
func TestRouteLogNamesDecisionKind(t *testing.T) {
	for _, tc := range []struct {
		name    string
		factory PolicyFactory
		want    map[string]bool // kinds that must appear; no other may
	}{
		{"kv", kvRouter, map[string]bool{scoring.KindHit: true, scoring.KindLoad: true}},
		{"round-robin", func(PolicyEnv) (Router, error) { return Router{Policy: scoring.NewRoundRobin()}, nil }, map[string]bool{scoring.KindTurn: true}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cfg := DefaultSimConfig()
			cfg.Policies = tc.factory
			var buf bytes.Buffer
			cfg.RouteLog = NewRouteLog(&buf)
			if _, err := RunSim(context.Background(), cfg, simWorkload(t, 4, 40, 0), tc.name, 4, 0); err != nil {
				t.Fatal(err)
			}
			seen := map[string]int{}
			for _, ev := range routeEvents(t, &buf) {
				if ev.Event == "route" {
					seen[ev.Kind]++
				} else if ev.Kind != "" {
					t.Errorf("%s line of request %d names kind %q", ev.Event, ev.Seq, ev.Kind)
				}
			}
			for k, n := range seen {
				if !tc.want[k] {
					t.Errorf("%d route lines of kind %q, want only %v", n, k, tc.want)
				}
			}
			for k := range tc.want {
				if seen[k] == 0 {
					t.Errorf("no route line of kind %q (saw %v)", k, seen)
				}
			}
		})
	}
}

// routeEvents decodes a route log, one RouteEvent per line.
func routeEvents(t *testing.T, r io.Reader) []RouteEvent {
	t.Helper()
	var evs []RouteEvent
	sc := bufio.NewScanner(r)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var ev RouteEvent
		if err := json.Unmarshal(sc.Bytes(), &ev); err != nil {
			t.Fatalf("line %q: %v", sc.Text(), err)
		}
		evs = append(evs, ev)
	}
	if err := sc.Err(); err != nil {
		t.Fatal(err)
	}
	return evs
}
