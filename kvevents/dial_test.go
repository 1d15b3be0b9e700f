package kvevents_test

import (
	"bytes"
	"context"
	"encoding/binary"
	"maps"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/internal/testwait"
	"github.com/kvrouter/kvrouter/kvevents"
)

// The per-pod subscriber against fake ZMTP peers that misbehave on the wire: a frame
// header announcing 2^40 bytes, a server that never greets, a publisher killed, a peer
// that stops answering PINGs, and replay sockets that do the same.

// startSub runs a subscriber with fast redials and returns it with its registry.
// The channel is closed when Run has returned.
func startSub(t *testing.T, cfg kvevents.Config, sink kvevents.Sink) (*kvevents.Subscriber, *prometheus.Registry, context.CancelFunc, <-chan struct{}) {
	t.Helper()
	return startSubWith(t, cfg, sink, nil)
}

// startSubWith is startSub calling prepare on the subscriber before Run.
func startSubWith(t *testing.T, cfg kvevents.Config, sink kvevents.Sink, prepare func(*kvevents.Subscriber)) (*kvevents.Subscriber, *prometheus.Registry, context.CancelFunc, <-chan struct{}) {
	t.Helper()
	if cfg.Watchdog == 0 {
		cfg.Watchdog = 2 * time.Second
	}
	cfg.BackoffMin = 20 * time.Millisecond
	cfg.BackoffMax = 200 * time.Millisecond
	reg := prometheus.NewRegistry()
	sub, err := kvevents.NewSubscriber(cfg, sink, nil, reg, nil)
	if err != nil {
		t.Fatal(err)
	}
	if prepare != nil {
		prepare(sub)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := sub.Run(ctx); err != nil {
			t.Errorf("Run: %v", err)
		}
	}()
	t.Cleanup(func() {
		cancel()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			t.Error("Run did not return after cancel")
		}
	})
	return sub, reg, cancel, done
}

// liveBatch is a live message: empty topic, seq, an array-encoded batch storing hs.
func liveBatch(seq uint64, hs ...uint64) [][]byte {
	b := &kvevents.Batch{TS: float64(time.Now().Unix()), Events: []kvevents.Event{stored(hs...)}}
	return [][]byte{{}, seqFrame(seq), kvevents.Encode(b, kvevents.EncodingArray)}
}

func mustSend(t *testing.T, c *fakeConn, frames [][]byte) {
	t.Helper()
	if err := c.send(frames...); err != nil {
		t.Fatal(err)
	}
}

func held(hs ...uint64) map[uint64]int {
	m := map[uint64]int{}
	for _, h := range hs {
		m[h]++
	}
	return m
}

// hugeHeader is a frame header announcing 2^40 bytes (and none of them sent).
var hugeHeader = []byte{0x02, 0, 0, 1, 0, 0, 0, 0, 0}

// TestSubscriberHostileFrame: a frame header announcing 2^40 bytes is counted as a bad
// message and ends that connection (nothing is allocated for it); the subscriber
// reconnects and goes on applying batches. A message over max_message_bytes but of a
// plausible size is read past on the same connection, and its loss shows as a gap.
func TestSubscriberHostileFrame(t *testing.T) {
	pub := newFakePub(t, "127.0.0.1:0")
	sink := newRefSink()
	sub, reg, _, _ := startSub(t, kvevents.Config{MaxMessageBytes: 64 << 10,
		Endpoints: []kvevents.EndpointConfig{{Name: "pod", Address: pub.addr()}}}, sink)
	c := pub.next(t)
	mustSend(t, c, liveBatch(0, 1))
	awaitState(t, sink, "pod", 0, held(1))

	if err := c.write(hugeHeader); err != nil {
		t.Fatal(err)
	}
	awaitMetric(t, reg, 1, "kvrouter_kv_events_bad_messages_total", "reason", "too_large")
	c2 := pub.next(t) // it redialled
	st := statusOf(t, sub, "pod", 0)
	if st.Redials < 1 || !strings.Contains(st.LastError, "announcing") {
		t.Errorf("after the huge frame: redials %d, last error %q", st.Redials, st.LastError)
	}
	mustSend(t, c2, liveBatch(1, 2))
	awaitSeq(t, sub, "pod", 0, 1)
	awaitState(t, sink, "pod", 0, held(2)) // the reconnect dropped what the old connection said

	// 100 KB, over the 64 KiB bound: read past, the connection stays.
	big := liveBatch(2, 3)
	big[2] = bytes.Repeat([]byte{0xc0}, 100<<10)
	mustSend(t, c2, big)
	mustSend(t, c2, liveBatch(3, 4))
	awaitSeq(t, sub, "pod", 0, 3)
	awaitState(t, sink, "pod", 0, held(4)) // the gap cleared the rank (no replay socket)
	awaitMetric(t, reg, 2, "kvrouter_kv_events_bad_messages_total", "reason", "too_large")
	st = statusOf(t, sub, "pod", 0)
	if st.Redials != 1 || !st.Connected || st.Gaps != 1 || st.Clears[kvevents.ClearGap] != 1 {
		t.Errorf("after the oversized message: redials %d connected %v gaps %d clears %v; want 1, true, 1, one gap clear",
			st.Redials, st.Connected, st.Gaps, st.Clears)
	}
}

// TestSubscriberHandshakeDeadline: a server that accepts TCP and never greets holds a
// dial for handshake_timeout at most, then the subscriber redials; it connects once the
// server greets. Cancelling Run closes a connection stuck in its handshake at once.
func TestSubscriberHandshakeDeadline(t *testing.T) {
	t.Run("redials", func(t *testing.T) {
		pub := newFakePub(t, "127.0.0.1:0")
		pub.silent.Store(true)
		sink := newRefSink()
		sub, _, _, _ := startSub(t, kvevents.Config{HandshakeTimeout: 100 * time.Millisecond,
			Endpoints: []kvevents.EndpointConfig{{Name: "pod", Address: pub.addr()}}}, sink)
		testwait.For(t, "two redials", func() bool { return statusOf(t, sub, "pod", 0).Redials >= 2 })
		st := statusOf(t, sub, "pod", 0)
		if st.Connected || !strings.Contains(st.LastError, "handshake") {
			t.Errorf("connected %v, last error %q; want false and a handshake error", st.Connected, st.LastError)
		}
		pub.silent.Store(false)
		c := pub.next(t)
		mustSend(t, c, liveBatch(0, 7))
		awaitState(t, sink, "pod", 0, held(7))
		if !statusOf(t, sub, "pod", 0).Connected {
			t.Error("not connected after a greeting")
		}
	})
	t.Run("cancel during the handshake", func(t *testing.T) {
		pub := newFakePub(t, "127.0.0.1:0")
		pub.silent.Store(true)
		_, _, cancel, done := startSub(t, kvevents.Config{HandshakeTimeout: time.Hour,
			Endpoints: []kvevents.EndpointConfig{{Name: "pod", Address: pub.addr()}}}, newRefSink())
		testwait.For(t, "a connection", func() bool {
			pub.mu.Lock()
			defer pub.mu.Unlock()
			return len(pub.conns) > 0
		})
		cancel()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Fatal("Run did not return while a handshake hung")
		}
	})
}

// TestSubscriberPublisherKilled: when the publisher's process dies its connections are
// closed, Connected turns false at once (the watchdog is an hour here) and
// OnConnectionLost's function hears of it; the new
// connection to a new publisher on the same port drops the old one's blocks.
func TestSubscriberPublisherKilled(t *testing.T) {
	pub := newFakePub(t, "127.0.0.1:0")
	addr := strings.TrimPrefix(pub.addr(), "tcp://")
	sink := newRefSink()
	var lost atomic.Int32
	sub, _, _, _ := startSubWith(t, kvevents.Config{Watchdog: time.Hour,
		Endpoints: []kvevents.EndpointConfig{{Name: "pod", Address: pub.addr()}}}, sink,
		func(s *kvevents.Subscriber) {
			s.OnConnectionLost(func(ep string) {
				if ep == "pod" {
					lost.Add(1)
				}
			})
		})
	c := pub.next(t)
	mustSend(t, c, liveBatch(0, 1))
	mustSend(t, c, liveBatch(1, 2))
	awaitState(t, sink, "pod", 0, held(1, 2))
	if !statusOf(t, sub, "pod", 0).Connected {
		t.Fatal("not connected")
	}
	pub.close()
	testwait.For(t, "Connected false", func() bool { return !statusOf(t, sub, "pod", 0).Connected })
	testwait.For(t, "OnConnectionLost", func() bool { return lost.Load() == 1 })
	if e := statusOf(t, sub, "pod", 0).LastError; !strings.Contains(e, "EOF") && !strings.Contains(e, "reset") {
		t.Errorf("last error %q, want the connection's end", e)
	}

	pub2 := newFakePub(t, addr)
	c2 := pub2.next(t)
	mustSend(t, c2, liveBatch(0, 9))
	awaitState(t, sink, "pod", 0, held(9))
	if st := statusOf(t, sub, "pod", 0); !st.Connected || st.Clears[kvevents.ClearReconnect] != 1 {
		t.Errorf("after the new publisher: connected %v clears %v; want true, one reconnect", st.Connected, st.Clears)
	}
}

// TestSubscriberWatchdogPing: an idle publisher that answers PINGs stays connected
// however long it is silent; once it stops answering (a half-dead peer), the watchdog
// closes the connection after watchdog of silence and redials.
func TestSubscriberWatchdogPing(t *testing.T) {
	pub := newFakePub(t, "127.0.0.1:0")
	sink := newRefSink()
	const wd = time.Second
	sub, _, _, _ := startSub(t, kvevents.Config{Watchdog: wd,
		Endpoints: []kvevents.EndpointConfig{{Name: "pod", Address: pub.addr()}}}, sink)
	c := pub.next(t)
	mustSend(t, c, liveBatch(0, 1))
	awaitState(t, sink, "pod", 0, held(1))
	// Silent for three watchdog periods: pinged, answered, kept.
	testwait.For(t, "pings", func() bool { return c.pings.Load() >= 3 })
	if st := statusOf(t, sub, "pod", 0); !st.Connected || st.Redials != 0 {
		t.Fatalf("an idle publisher answering PINGs: connected %v redials %d; want true, 0", st.Connected, st.Redials)
	}
	pub.noPong.Store(true)
	testwait.For(t, "the watchdog", func() bool { return statusOf(t, sub, "pod", 0).Redials >= 1 })
	if e := statusOf(t, sub, "pod", 0).LastError; !strings.Contains(e, "watchdog") {
		t.Errorf("last error %q, want the watchdog's", e)
	}
	c2 := pub.next(t)
	mustSend(t, c2, liveBatch(1, 2))
	awaitState(t, sink, "pod", 0, held(2))
}

// TestSubscriberNoPingToZMTP30: a ZMTP 3.0 peer (go-zeromq/zmq4's PUB, as in vllm-sim)
// is never sent a PING, which 3.0 does not define (zmq4 queues each as an inbound
// message until its readers stall), and is not dropped for being silent.
func TestSubscriberNoPingToZMTP30(t *testing.T) {
	pub := newFakePub(t, "127.0.0.1:0")
	pub.zmtp30.Store(true)
	pub.noPong.Store(true)
	sink := newRefSink()
	const wd = 200 * time.Millisecond
	sub, _, _, _ := startSub(t, kvevents.Config{Watchdog: wd,
		Endpoints: []kvevents.EndpointConfig{{Name: "pod", Address: pub.addr()}}}, sink)
	c := pub.next(t)
	mustSend(t, c, liveBatch(0, 1))
	awaitState(t, sink, "pod", 0, held(1))
	time.Sleep(5 * wd) // idle: a 3.1 peer would have been pinged several times by now
	mustSend(t, c, liveBatch(1, 2))
	awaitState(t, sink, "pod", 0, held(1, 2))
	if n := c.pings.Load(); n != 0 {
		t.Errorf("a ZMTP 3.0 peer was sent %d PINGs", n)
	}
	if st := statusOf(t, sub, "pod", 0); !st.Connected || st.Redials != 0 {
		t.Errorf("connected %v redials %d; want true, 0", st.Connected, st.Redials)
	}
}

// TestSubscriberReplayPeers: a slow joiner (first batch seq 3) recovers batches 0..2
// through a replay ROUTER; one that answers with a frame announcing 2^40 bytes, or never
// greets, fails the recovery within its bounds, the rank is cleared, and the live stream
// goes on.
func TestSubscriberReplayPeers(t *testing.T) {
	tests := []struct {
		name    string
		router  func(c *fakeConn, req [][]byte)
		silent  bool
		want    map[uint64]int
		failure bool
	}{
		{"well-behaved", func(c *fakeConn, req [][]byte) {
			from := binary.BigEndian.Uint64(req[1])
			for s := from; s < 3; s++ {
				_ = c.send(liveBatch(s, 10+s)...) // ["", seq, payload]
			}
			_ = c.send([]byte{}, bytes.Repeat([]byte{0xff}, 8), []byte{})
		}, false, held(10, 11, 12, 13), false},
		{"huge frame", func(c *fakeConn, req [][]byte) { _ = c.write(hugeHeader) }, false, held(13), true},
		{"never greets", nil, true, held(13), true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pub := newFakePub(t, "127.0.0.1:0")
			router := newFakePeer(t, "127.0.0.1:0", "ROUTER")
			router.onMessage = tc.router
			router.silent.Store(tc.silent)
			sink := newRefSink()
			sub, _, _, _ := startSub(t, kvevents.Config{HandshakeTimeout: 300 * time.Millisecond,
				ReplayTimeout: 5 * time.Second, Endpoints: []kvevents.EndpointConfig{
					{Name: "pod", Address: pub.addr(), ReplayAddress: router.addr()}}}, sink)
			c := pub.next(t)
			mustSend(t, c, liveBatch(3, 13))
			awaitSeq(t, sub, "pod", 0, 3)
			awaitState(t, sink, "pod", 0, tc.want)
			st := statusOf(t, sub, "pod", 0)
			if st.Replays != 1 || (st.ReplayFailures == 1) != tc.failure || !st.Connected {
				t.Errorf("replays %d failures %d connected %v; want 1, failure=%v, true",
					st.Replays, st.ReplayFailures, st.Connected, tc.failure)
			}
			if tc.failure && st.Clears[kvevents.ClearReplayFailed] != 1 {
				t.Errorf("clears %v, want one replay_failed", st.Clears)
			}
			mustSend(t, c, liveBatch(4, 14))
			want := maps.Clone(tc.want)
			want[14]++
			awaitState(t, sink, "pod", 0, want)
		})
	}
}
