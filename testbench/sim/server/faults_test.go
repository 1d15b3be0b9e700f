package server_test

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/testbench/sim/server"
)

// heldSink counts, per handle, the blocks a subscriber was told are stored.
type heldSink struct {
	mu   sync.Mutex
	held map[uint64]int
}

func (s *heldSink) Apply(_ string, _ int, b *kvevents.Batch) {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, ev := range b.Events {
		switch ev := ev.(type) {
		case *kvevents.BlockStored:
			for _, h := range ev.BlockHashes {
				s.held[h]++
			}
		case *kvevents.BlockRemoved:
			for _, h := range ev.BlockHashes {
				if s.held[h]--; s.held[h] <= 0 {
					delete(s.held, h)
				}
			}
		}
	}
}

func (s *heldSink) Clear(string, int) {
	s.mu.Lock()
	clear(s.held)
	s.mu.Unlock()
}

func (s *heldSink) blocks() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.held)
}

// TestKVEventFaults drives the fault-injection endpoints with kvrouter's subscriber on
// the other end: dropped batches show as a gap recovered by replay; a connection reset
// is a redial that rebuilds the same blocks from the replay buffer (the sequence goes
// on); POST /reset_prefix_cache empties the cache and the subscriber's view with it.
func TestKVEventFaults(t *testing.T) {
	s, hs := start(t, func(c *server.Config) {
		c.KVEvents.EnableKVCacheEvents = true
		c.KVEvents.Endpoint = "tcp://127.0.0.1:0"
		c.KVEvents.ReplayEndpoint = "tcp://127.0.0.1:0"
		c.KVEvents.Bind = true
	})
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	pubAddr, repAddr, err := s.PublisherAddr(ctx, 0)
	if err != nil {
		t.Fatal(err)
	}
	sink := &heldSink{held: map[uint64]int{}}
	sub, err := kvevents.NewSubscriber(kvevents.Config{BackoffMin: 20 * time.Millisecond, BackoffMax: 100 * time.Millisecond,
		Endpoints: []kvevents.EndpointConfig{{Name: "pod", Address: "tcp://" + pubAddr, ReplayAddress: "tcp://" + repAddr}}},
		sink, nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- sub.Run(ctx) }()
	defer func() {
		cancel()
		<-done
	}()
	status := func() kvevents.StreamStatus { return sub.Status()[0] }
	await := func(what string, ok func(kvevents.StreamStatus) bool) {
		t.Helper()
		for deadline := time.Now().Add(20 * time.Second); !ok(status()); {
			if time.Now().After(deadline) {
				t.Fatalf("%s: status %+v, %d blocks held", what, status(), sink.blocks())
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	complete := func(first int) {
		t.Helper()
		if code, body := post(t, hs, "/v1/completions", `{"prompt":`+ids(first, 40)+`,"max_tokens":1}`); code != http.StatusOK {
			t.Fatalf("completion %d: %s", code, body)
		}
	}
	await("connected", func(st kvevents.StreamStatus) bool { return st.Connected })
	complete(1)
	await("first batch", func(st kvevents.StreamStatus) bool { return st.HasSeq && sink.blocks() == 2 })

	if code, _ := post(t, hs, "/debug/drop-kv-events?batches=-1", ""); code != http.StatusBadRequest {
		t.Fatalf("drop -1 batches: %d, want 400", code)
	}
	if code, _ := post(t, hs, "/debug/drop-kv-events?batches=1", ""); code != http.StatusNoContent {
		t.Fatalf("drop: %d", code)
	}
	complete(100) // its batch is dropped
	complete(200) // its batch shows the gap
	await("gap recovered", func(st kvevents.StreamStatus) bool { return st.Gaps == 1 && st.Replays == 1 && sink.blocks() == 6 })
	if st := status(); st.ReplayFailures != 0 || len(st.Clears) != 0 {
		t.Fatalf("after the gap: replay failures %d clears %v; want none", st.ReplayFailures, st.Clears)
	}
	last := status().LastSeq

	if code, _ := post(t, hs, "/debug/reset-kv-connections", ""); code != http.StatusNoContent {
		t.Fatalf("reset connections: %d", code)
	}
	await("rebuilt after the reset", func(st kvevents.StreamStatus) bool {
		return st.Redials >= 1 && st.Connected && st.Clears[kvevents.ClearReconnect] == 1 && st.LastSeq == last && sink.blocks() == 6
	})
	complete(300) // the sequence goes on after the reset
	await("a batch after the reset", func(st kvevents.StreamStatus) bool { return st.LastSeq == last+1 && sink.blocks() == 8 })
	if _, port, _ := net.SplitHostPort(pubAddr); port == "0" {
		t.Fatal("publisher address still says port 0")
	}

	if code, _ := post(t, hs, "/reset_prefix_cache", ""); code != http.StatusOK {
		t.Fatalf("reset_prefix_cache: %d", code)
	}
	await("cleared", func(kvevents.StreamStatus) bool { return sink.blocks() == 0 })
	// Batches numbered: ..., last+1 (the request after the reset), then AllBlocksCleared.
	if got := get(t, hs, "/debug/cache"); got != fmt.Sprintf("{\"cached_blocks\":0,\"kv_batches\":[%d]}\n", last+3) {
		t.Fatalf("after reset_prefix_cache: %q", got)
	}
}
