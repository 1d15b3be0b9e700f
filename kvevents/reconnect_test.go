package kvevents_test

import (
	"bytes"
	"encoding/binary"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/kvrouter/kvrouter/internal/testwait"
	"github.com/kvrouter/kvrouter/kvevents"
)

// TestSubscriberReconnectDropsOldBlocks: a pod restarts and its new publisher comes up
// on the same address with a sequence that happens to follow the old one's. The old
// blocks are dropped as soon as the new connection is up, before any batch arrives;
// with a replay socket the first batch then rebuilds the endpoint from sequence 0.
func TestSubscriberReconnectDropsOldBlocks(t *testing.T) {
	tests := []struct {
		name   string
		replay bool
		want   map[uint64]int
	}{
		{"no replay socket: cleared", false, held(22)},
		{"replay socket: rebuilt from 0", true, held(20, 21, 22)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			pub := newFakePub(t, "127.0.0.1:0")
			addr := strings.TrimPrefix(pub.addr(), "tcp://")
			ep := kvevents.EndpointConfig{Name: "pod", Address: pub.addr()}
			if tc.replay {
				// The replay socket serves the new process's batches 0 and 1.
				router := newFakePeer(t, "127.0.0.1:0", "ROUTER")
				router.onMessage = func(c *fakeConn, req [][]byte) {
					for s := binary.BigEndian.Uint64(req[1]); s < 2; s++ {
						_ = c.send(liveBatch(s, 20+s)...)
					}
					_ = c.send([]byte{}, bytes.Repeat([]byte{0xff}, 8), []byte{})
				}
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

			pub2 := newFakePub(t, addr)
			c2 := pub2.next(t)
			awaitState(t, sink, "pod", 0, held()) // cleared on reconnect, nothing sent yet
			mustSend(t, c2, liveBatch(2, 22))     // the new process's batch 2: not a continuation
			awaitSeq(t, sub, "pod", 0, 2)
			awaitState(t, sink, "pod", 0, tc.want)
			st := statusOf(t, sub, "pod", 0)
			if st.Clears[kvevents.ClearReconnect] != 1 || st.Gaps != 0 {
				t.Errorf("clears %v gaps %d; want one reconnect clear, no gap", st.Clears, st.Gaps)
			}
			if tc.replay && (st.Replays != 1 || st.ReplayFailures != 0) {
				t.Errorf("replays %d failures %d; want 1, 0", st.Replays, st.ReplayFailures)
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
