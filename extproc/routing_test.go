package extproc_test

import (
	"sync"
	"testing"

	"github.com/kvrouter/kvrouter/extproc"
	"github.com/kvrouter/kvrouter/testbench/fakeenvoy"
)

// A request keeps the policy that routed it to its end: after SetRouting, its FirstToken
// and Finished go to the old policy's Observer, and the next request is picked and
// observed by the new one only.
func TestSetRoutingKeepsInFlightRequestsOnTheirPolicy(t *testing.T) {
	h := newHarness(t)
	old := h.policy
	x := h.start(fakeenvoy.FullDuplex())
	res, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chatBody("m")}})
	if err != nil {
		t.Fatal(err)
	}
	if res.Immediate != nil {
		t.Fatalf("immediate response %v", res.Immediate)
	}

	next := &recordingPolicy{}
	h.srv.SetRouting(extproc.Routing{Policy: next})

	// The first request's response arrives after the swap.
	if _, err := x.ResponseHeaders(fakeenvoy.Headers{{Key: ":status", Value: "200"}}, false, nil); err != nil {
		t.Fatal(err)
	}
	if err := x.ResponseBody([]byte("data: {}\n\n"), true); err != nil {
		t.Fatal(err)
	}
	if _, _, err := x.ReadResponseBody(); err != nil {
		t.Fatal(err)
	}
	if err := x.Close(); err != nil {
		t.Fatal(err)
	}
	h.waitIdle()

	y := h.start(fakeenvoy.FullDuplex())
	if _, err := y.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chatBody("m")}}); err != nil {
		t.Fatal(err)
	}
	y.Cancel()
	h.waitIdle()

	picks, routed, first, finished := old.snapshot()
	if len(picks) != 1 || len(routed) != 1 || len(first) != 1 || len(finished) != 1 {
		t.Fatalf("old policy: picks %d routed %v first %v finished %v, want one of each", len(picks), routed, first, finished)
	}
	picks, routed, first, finished = next.snapshot()
	if len(picks) != 1 || len(routed) != 1 || len(first) != 0 || len(finished) != 1 {
		t.Fatalf("new policy: picks %d routed %v first %v finished %v, want the second request only", len(picks), routed, first, finished)
	}
	if routed[0] == "" || finished[0] == "" || finished[0] != routed[0][:len(finished[0])] {
		t.Fatalf("new policy finished %v, routed %v", finished, routed)
	}
}

// SetRouting may run while requests are decided (run with -race): every request is
// routed by one of the policies and each policy is told Finished exactly for the
// requests it was told Routed.
func TestSetRoutingConcurrentWithPicks(t *testing.T) {
	h := newHarness(t)
	pols := []*recordingPolicy{h.policy, {}, {}}
	var wg sync.WaitGroup
	const requests = 60
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range requests {
			h.srv.SetRouting(extproc.Routing{Policy: pols[i%len(pols)]})
		}
	}()
	for range 4 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range requests / 4 {
				x := h.start(fakeenvoy.FullDuplex())
				if _, err := x.Request(fakeenvoy.Request{Headers: postHeaders(), Body: [][]byte{chatBody("m")}}); err != nil {
					t.Error(err)
				}
				x.Cancel()
			}
		}()
	}
	wg.Wait()
	h.waitIdle()
	total := 0
	for i, p := range pols {
		_, routed, _, finished := p.snapshot()
		if len(routed) != len(finished) {
			t.Errorf("policy %d: routed %d, finished %d", i, len(routed), len(finished))
		}
		total += len(routed)
	}
	if total != requests {
		t.Fatalf("%d requests routed, want %d", total, requests)
	}
}
