package kvevents_test

import (
	"bytes"
	"encoding/binary"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvrouter/kvrouter/internal/testmetrics"
	"github.com/kvrouter/kvrouter/internal/testwait"
	"github.com/kvrouter/kvrouter/kvevents"
)

// replayPeer is a fake replay ROUTER serving whatever batches the test says the
// publisher process currently buffers (seq -> stored handle), from the requested seq on.
type replayPeer struct {
	*fakePub
	mu       sync.Mutex
	buffered [][2]uint64 // (seq, handle), oldest first
}

func newReplayPeer(t *testing.T) *replayPeer {
	r := &replayPeer{fakePub: newFakePeer(t, "127.0.0.1:0", "ROUTER")}
	r.onMessage = func(c *fakeConn, req [][]byte) {
		from := binary.BigEndian.Uint64(req[1])
		r.mu.Lock()
		buf := slices.Clone(r.buffered)
		r.mu.Unlock()
		for _, b := range buf {
			if b[0] >= from {
				_ = c.send(liveBatch(b[0], b[1])...)
			}
		}
		_ = c.send([]byte{}, bytes.Repeat([]byte{0xff}, 8), []byte{})
	}
	return r
}

// set replaces the buffer with batches first, first+1, ... storing handles hs.
func (r *replayPeer) set(first uint64, hs ...uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.buffered = r.buffered[:0]
	for i, h := range hs {
		r.buffered = append(r.buffered, [2]uint64{first + uint64(i), h})
	}
}

// TestSubscriberReconnectDropsOldBlocks: a pod restarts and its new publisher comes up
// on the same address with a sequence that happens to follow the old one's. The old
// blocks are dropped as soon as the new connection is up; with a replay socket the
// endpoint is rebuilt from sequence 0 at once, before any live batch arrives.
func TestSubscriberReconnectDropsOldBlocks(t *testing.T) {
	tests := []struct {
		name        string
		replay      bool
		afterRejoin map[uint64]int // before the new process sends anything live
		want        map[uint64]int
	}{
		{"no replay socket: cleared", false, held(), held(22)},
		{"replay socket: rebuilt from 0", true, held(20, 21), held(20, 21, 22)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pub := newFakePub(t, "127.0.0.1:0")
			addr := strings.TrimPrefix(pub.addr(), "tcp://")
			ep := kvevents.EndpointConfig{Name: "pod", Address: pub.addr()}
			var router *replayPeer
			if tc.replay {
				router = newReplayPeer(t) // the first process has buffered nothing yet
				ep.ReplayAddress = router.addr()
			}
			sink := newRefSink()
			sub, _, _, _ := startSub(t, kvevents.Config{Watchdog: time.Hour,
				Endpoints: []kvevents.EndpointConfig{ep}}, sink)
			c := pub.next(t)
			mustSend(t, c, liveBatch(0, 1))
			mustSend(t, c, liveBatch(1, 2))
			awaitState(t, sink, "pod", 0, held(1, 2))
			pub.close()

			if router != nil {
				router.set(0, 20, 21) // the new process's batches 0 and 1, sent before we reconnect
			}
			pub2 := newFakePub(t, addr)
			c2 := pub2.next(t)
			awaitState(t, sink, "pod", 0, tc.afterRejoin)
			mustSend(t, c2, liveBatch(2, 22)) // the new process's batch 2: not a continuation
			awaitSeq(t, sub, "pod", 0, 2)
			awaitState(t, sink, "pod", 0, tc.want)
			st := statusOf(t, sub, "pod", 0)
			if st.Clears[kvevents.ClearReconnect] != 1 || st.Gaps != 0 {
				t.Errorf("clears %v gaps %d; want one reconnect clear, no gap", st.Clears, st.Gaps)
			}
			if tc.replay && (st.Replays != 1 || st.ReplayFailures != 0) {
				t.Errorf("replays %d failures %d; want 1 (the rebuild; the first one found nothing), 0", st.Replays, st.ReplayFailures)
			}
		})
	}
}

// TestSubscriberRebuildsOnConnect: a subscriber (a restarted router) connects to a pod
// that keeps its cache and sends nothing more. With a replay socket the endpoint is
// rebuilt at once from the buffered batches; live batches the rebuild already applied
// are skipped (not taken for a publisher restart), and the stream continues after
// them. A buffer that no longer starts at 0 is applied from its oldest batch and counted
// as an incomplete replay, with nothing cleared.
func TestSubscriberRebuildsOnConnect(t *testing.T) {
	tests := []struct {
		name         string
		first        uint64
		failures     uint64
		evictedLabel float64
	}{
		{"whole history buffered", 0, 0, 0},
		{"oldest batches evicted", 5, 1, 1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pub := newFakePub(t, "127.0.0.1:0")
			router := newReplayPeer(t)
			router.set(tc.first, 10, 11, 12)
			sink := newRefSink()
			sub, reg, _, _ := startSub(t, kvevents.Config{Watchdog: time.Hour, Endpoints: []kvevents.EndpointConfig{
				{Name: "pod", Address: pub.addr(), ReplayAddress: router.addr()}}}, sink)
			c := pub.next(t)
			awaitState(t, sink, "pod", 0, held(10, 11, 12)) // nothing sent live
			last := tc.first + 2
			awaitSeq(t, sub, "pod", 0, last)
			mustSend(t, c, liveBatch(last-1, 11)) // published during the rebuild: already applied
			mustSend(t, c, liveBatch(last, 12))
			mustSend(t, c, liveBatch(last+1, 13))
			awaitSeq(t, sub, "pod", 0, last+1)
			awaitState(t, sink, "pod", 0, held(10, 11, 12, 13))
			st := statusOf(t, sub, "pod", 0)
			if len(st.Clears) != 0 || st.Gaps != 0 || st.Replays != 1 || st.ReplayFailures != tc.failures || !st.Connected {
				t.Errorf("clears %v gaps %d replays %d failures %d connected %v; want none, 0, 1, %d, true",
					st.Clears, st.Gaps, st.Replays, st.ReplayFailures, st.Connected, tc.failures)
			}
			if got := testmetrics.Must(t, reg, "kvrouter_kv_events_replays_total", "result", "evicted"); got != tc.evictedLabel {
				t.Errorf("replays_total{result=evicted} = %v, want %v", got, tc.evictedLabel)
			}
		})
	}
}

// fakeClock is a settable kvevents.Clock.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) add(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

// TestSubscriberFailuresLoggedRateLimited: undecodable batches are logged with the
// endpoint and the reason, once per kind per interval whatever their number (the next
// line says how many were not logged), and the stream's last error says what happened.
func TestSubscriberFailuresLoggedRateLimited(t *testing.T) {
	pub := newFakePub(t, "127.0.0.1:0")
	core, logs := observer.New(zapcore.WarnLevel)
	clock := &fakeClock{now: time.Unix(1_700_000_000, 0)}
	cfg := kvevents.Config{Watchdog: time.Hour, BackoffMin: 20 * time.Millisecond,
		Endpoints: []kvevents.EndpointConfig{{Name: "pod", Address: pub.addr()}}}
	sink := newRefSink()
	sub, err := kvevents.NewSubscriber(cfg, sink, zap.New(core), nil, clock)
	if err != nil {
		t.Fatal(err)
	}
	runUntilCleanup(t, sub)
	c := pub.next(t)
	garbage := func(seq uint64) [][]byte { return [][]byte{{}, seqFrame(seq), []byte("\xc1garbage")} }
	for seq := range uint64(3) {
		mustSend(t, c, garbage(seq))
	}
	awaitSeq(t, sub, "pod", 0, 2)
	count := func(msg string) int { return logs.FilterMessage(msg).Len() }
	if n := count("KV events batch undecodable"); n != 1 {
		t.Errorf("3 undecodable batches within the interval logged %d times, want 1", n)
	}
	if n := count("KV events endpoint cleared"); n != 1 {
		t.Errorf("3 clears within the interval logged %d times, want 1", n)
	}
	first := logs.FilterMessage("KV events batch undecodable").All()[0].ContextMap()
	if first["endpoint"] != "pod" || first["reason"] != string(kvevents.ReasonBadType) {
		t.Errorf("log fields %v; want endpoint pod and the decode reason", first)
	}
	if e := statusOf(t, sub, "pod", 0).LastError; !strings.Contains(e, "cleared: gap") {
		t.Errorf("last error %q, want the gap clear", e)
	}

	clock.add(time.Minute)
	mustSend(t, c, garbage(3))
	awaitSeq(t, sub, "pod", 0, 3)
	testwait.For(t, "a second decode log", func() bool { return count("KV events batch undecodable") == 2 })
	second := logs.FilterMessage("KV events batch undecodable").All()[1].ContextMap()
	if second["suppressed_since_last_log"] != int64(2) {
		t.Errorf("second log fields %v; want suppressed_since_last_log 2", second)
	}
}
