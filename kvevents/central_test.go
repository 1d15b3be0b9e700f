package kvevents_test

import (
	"context"
	"encoding/binary"
	"io"
	"log"
	"maps"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-zeromq/zmq4"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/internal/testmetrics"
	"github.com/kvrouter/kvrouter/internal/testwait"
	"github.com/kvrouter/kvrouter/kvevents"
)

// modelSink is a refSink that also records the model each stream's batches named.
type modelSink struct {
	*refSink
	mu     sync.Mutex
	models map[streamKey]string
}

func newModelSink() *modelSink {
	return &modelSink{refSink: newRefSink(), models: map[streamKey]string{}}
}

func (s *modelSink) Apply(endpoint string, rank int, b *kvevents.Batch) {
	s.mu.Lock()
	s.models[streamKey{endpoint, rank}] = b.Model
	s.mu.Unlock()
	s.refSink.Apply(endpoint, rank, b)
}

func (s *modelSink) model(endpoint string, rank int) string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.models[streamKey{endpoint, rank}]
}

func (s *modelSink) clears(endpoint string, rank int) int {
	s.refSink.mu.Lock()
	defer s.refSink.mu.Unlock()
	return s.clear[streamKey{endpoint, rank}]
}

// runCentral runs a subscriber bound on 127.0.0.1:port with the given endpoints.
func runCentral(t *testing.T, port int, mod func(*kvevents.Config), sink kvevents.Sink, eps ...kvevents.EndpointConfig) (*kvevents.Subscriber, *prometheus.Registry) {
	t.Helper()
	cfg := kvevents.Config{Bind: tcp(port), Endpoints: eps, ReplayIdle: 100 * time.Millisecond, ReplayTimeout: 3 * time.Second}
	if mod != nil {
		mod(&cfg)
	}
	reg := prometheus.NewRegistry()
	sub := startSubscriber(t, cfg, sink, reg)
	testwait.For(t, "the central socket to listen", func() bool {
		c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
		if err == nil {
			c.Close()
		}
		return err == nil
	})
	return sub, reg
}

func central(name string, ranks int) kvevents.EndpointConfig {
	return kvevents.EndpointConfig{Name: name, Central: true, DPRanks: ranks}
}

func awaitMetric(t *testing.T, reg *prometheus.Registry, want float64, name string, labels ...string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for testmetrics.Must(t, reg, name, labels...) < want {
		if time.Now().After(deadline) {
			t.Fatalf("%s%v = %v, want %v", name, labels, testmetrics.Must(t, reg, name, labels...), want)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// centralPeer starts publisher.py connecting from srcIP to the central socket with the
// topic kv@srcIP:8000@model (or topic when set), waiting for the subscription first so
// that nothing is lost to the slow joiner.
func centralPeer(t *testing.T, port int, srcIP, topic string, args ...string) *peer {
	t.Helper()
	ep := "tcp://" + srcIP + ":0;127.0.0.1:" + strconv.Itoa(port)
	p := startPeer(t, append([]string{"--connect", "--pub", ep, "--topic", topic,
		"--wait-sub-after", "0", "--interval", "0.001"}, args...)...)
	if l := p.line(); l != "waiting" {
		t.Fatalf("publisher said %q", l)
	}
	return p
}

// TestCentralRealPeers: real libzmq publishers connect to the bound socket, as vLLM's
// do in central mode. Each endpoint ends with exactly its publisher's blocks under the
// model its topic names; a publisher naming an address discovery does not know, or an
// address that is not its own, is dropped and counted; a restarted publisher (sequence
// back to 0) clears its endpoint only; a garbled payload and a garbled connection are
// counted and leave the other endpoints alone.
func TestCentralRealPeers(t *testing.T) {
	requirePeer(t)
	port := freePorts(t, 1)
	sink := newModelSink()
	const a, b = "127.0.0.2:8000", "127.0.0.3:8000"
	sub, reg := runCentral(t, port, nil, sink, central(a, 1), central(b, 1))

	pa := centralPeer(t, port, "127.0.0.2", kvevents.CentralTopic(a, "model-a"), "--seed", "1", "--batches", "60")
	pb := centralPeer(t, port, "127.0.0.3", kvevents.CentralTopic(b, "model-b"), "--seed", "2", "--batches", "80",
		"--encoding", "map", "--garble", "40")
	// Unknown endpoint, and a peer speaking for another's address.
	pu := centralPeer(t, port, "127.0.0.4", kvevents.CentralTopic("127.0.0.4:8000", "model-a"), "--seed", "3", "--batches", "5")
	ps := centralPeer(t, port, "127.0.0.5", kvevents.CentralTopic(a, "model-a"), "--seed", "4", "--batches", "5")

	ra, rb := pa.result(), pb.result()
	pu.result()
	ps.result()
	awaitSeq(t, sub, a, 0, 59)
	awaitSeq(t, sub, b, 0, 79)
	awaitState(t, sink.refSink, a, 0, toHandles(t, ra.View))
	awaitState(t, sink.refSink, b, 0, toHandles(t, rb.View))
	if !maps.Equal(toHandles(t, ra.View), toHandles(t, ra.Holds)) {
		t.Fatal("publisher a lost batches: the test expects none")
	}
	if got := sink.model(a, 0); got != "model-a" {
		t.Errorf("a's batches keyed under %q, want model-a", got)
	}
	if got := sink.model(b, 0); got != "model-b" {
		t.Errorf("b's batches keyed under %q, want model-b", got)
	}
	awaitMetric(t, reg, 5, "kvrouter_kv_events_bad_messages_total", "reason", "unknown_endpoint")
	awaitMetric(t, reg, 5, "kvrouter_kv_events_bad_messages_total", "reason", "source")
	if st := statusOf(t, sub, b, 0); sumReasons(st.DecodeErrors) == 0 {
		t.Errorf("garbled batch not counted: %+v", st.DecodeErrors)
	}
	if n := sink.clears(a, 0); n != 0 {
		t.Errorf("a cleared %d times by others' faults", n)
	}
	for _, name := range []string{"127.0.0.4:8000", "127.0.0.5:8000"} {
		for _, s := range sub.Status() {
			if s.Endpoint == name {
				t.Errorf("a stream was created for %s", name)
			}
		}
	}

	// A connection that speaks garbage is closed and counted; the others go on.
	c, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	c.Write(append([]byte{0xff, 0, 0, 0, 0, 0, 0, 0, 1, 0x7f, 3, 0}, make([]byte, 52)...))
	c.Write([]byte("\x04\x29\x05READY\x0bSocket-Type\x00\x00\x00\x03PUB\x08Identity\x00\x00\x00\x00"))
	c.Write([]byte{0xf0, 1, 2, 3})
	awaitMetric(t, reg, 1, "kvrouter_kv_events_central_connections_total", "result", "handshake_failed")
	c.Close()

	// Restart a: a new process, sequence from 0, another workload. b is untouched.
	bBefore := sink.snapshot(b, 0)
	bClears := sink.clears(b, 0)
	pa.stop()
	pa2 := centralPeer(t, port, "127.0.0.2", kvevents.CentralTopic(a, "model-a"), "--seed", "9", "--batches", "30")
	ra2 := pa2.result()
	awaitState(t, sink.refSink, a, 0, toHandles(t, ra2.View))
	if n := sink.clears(a, 0); n < 1 {
		t.Errorf("restart did not clear a (%d clears)", n)
	}
	if st := statusOf(t, sub, a, 0); st.Clears[kvevents.ClearReconnect] < 1 {
		t.Errorf("restart's new connection not counted: %+v", st.Clears)
	}
	if got := sink.snapshot(b, 0); !maps.Equal(got, bBefore) || sink.clears(b, 0) != bClears {
		t.Error("a's restart changed b")
	}
	if st := statusOf(t, sub, a, 0); !st.Connected || !st.Central || st.Model != "model-a" {
		t.Errorf("status %+v", st)
	}
}

// TestCentralRealPeerReplay: a publisher connecting late (slow joiner: batches before
// the subscription are lost on the wire) is rebuilt through its pod's replay socket.
func TestCentralRealPeerReplay(t *testing.T) {
	requirePeer(t)
	port := freePorts(t, 2)
	sink := newModelSink()
	const a = "127.0.0.2:8000"
	ep := central(a, 1)
	ep.ReplayAddress = tcp(port + 1)
	sub, _ := runCentral(t, port, nil, sink, ep)
	// --drop loses 10..14 on the wire (kept for replay): the gap is replayed.
	p := startPeer(t, "--connect", "--pub", "tcp://127.0.0.2:0;127.0.0.1:"+strconv.Itoa(port),
		"--topic", kvevents.CentralTopic(a, "m"), "--replay", tcp(port+1), "--wait-sub-after", "0",
		"--interval", "0.001", "--batches", "40", "--drop", "10,11,12,13,14")
	p.line() // waiting
	r := p.result()
	awaitSeq(t, sub, a, 0, 39)
	awaitState(t, sink.refSink, a, 0, toHandles(t, r.Holds))
	st := statusOf(t, sub, a, 0)
	if st.Gaps == 0 || st.Replays == 0 || st.ReplayFailures != 0 || sink.clears(a, 0) != 0 {
		t.Errorf("gap not replayed: %+v", st)
	}
}

// goPub is a zmq4 PUB dialling the central socket: the Go encoder's batches, on the
// wire as vLLM sends them.
type goPub struct {
	t    *testing.T
	sock zmq4.Socket
	seq  uint64
}

func dialPub(t *testing.T, port int) *goPub {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	sock := zmq4.NewPub(ctx, zmq4.WithLogger(discardLogger()))
	t.Cleanup(func() { sock.Close(); cancel() })
	if err := sock.Dial("tcp://127.0.0.1:" + strconv.Itoa(port)); err != nil {
		t.Fatal(err)
	}
	return &goPub{t: t, sock: sock}
}

func (p *goPub) send(topic string, b *kvevents.Batch) {
	p.t.Helper()
	p.sendSeq(topic, p.seq, kvevents.Encode(b, kvevents.EncodingArray))
	p.seq++
}

func (p *goPub) sendSeq(topic string, seq uint64, payload []byte) {
	p.t.Helper()
	var s [8]byte
	binary.BigEndian.PutUint64(s[:], seq)
	if err := p.sock.Send(zmq4.NewMsgFrom([]byte(topic), s[:], payload)); err != nil {
		p.t.Fatal(err)
	}
}

// awaitSubscribed sends probe batches until the subscriber has seen one (zmq4's PUB
// drops messages until the subscription arrives), then returns the probe's sequence.
func (p *goPub) awaitSubscribed(sub *kvevents.Subscriber, topic, endpoint string, rank int) {
	p.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		p.send(topic, centralStored(uint64(1000+p.seq), 1))
		time.Sleep(20 * time.Millisecond)
		for _, s := range sub.Status() {
			if s.Endpoint == endpoint && s.Rank == rank && s.HasSeq {
				return
			}
		}
		if time.Now().After(deadline) {
			p.t.Fatal("the central socket never received a probe")
		}
	}
}

func centralStored(first uint64, n int) *kvevents.Batch {
	ev := &kvevents.BlockStored{BlockSize: 16, Medium: "GPU"}
	for i := range n {
		ev.BlockHashes = append(ev.BlockHashes, first+uint64(i))
	}
	ev.TokenIDs = make([]uint32, 16*n)
	return &kvevents.Batch{TS: 1, Events: []kvevents.Event{ev}}
}

// TestCentralDataParallelRanks: a pod's ranks connect to the bind port + rank with the
// same topic; each port is its own stream with its own sequence.
func TestCentralDataParallelRanks(t *testing.T) {
	port := freePorts(t, 2)
	sink := newModelSink()
	const a = "127.0.0.1:8000"
	sub, _ := runCentral(t, port, nil, sink, central(a, 2))
	topic := kvevents.CentralTopic(a, "m")
	r0, r1 := dialPub(t, port), dialPub(t, port+1)
	r0.awaitSubscribed(sub, topic, a, 0)
	r1.awaitSubscribed(sub, topic, a, 1)
	base0, base1 := sink.snapshot(a, 0), sink.snapshot(a, 1)
	r0.send(topic, centralStored(1, 3))
	r1.send(topic, centralStored(50, 2))
	want0, want1 := maps.Clone(base0), maps.Clone(base1)
	for _, h := range []uint64{1, 2, 3} {
		want0[h]++
	}
	for _, h := range []uint64{50, 51} {
		want1[h]++
	}
	awaitState(t, sink.refSink, a, 0, want0)
	awaitState(t, sink.refSink, a, 1, want1)
	if sink.clears(a, 0) != 0 || sink.clears(a, 1) != 0 {
		t.Error("ranks cleared each other")
	}
}

// TestCentralFaults, with the Go encoder: an oversized message is read past and its
// stream sees a gap; a silent TCP client does not hold up a publisher; a removed
// endpoint's messages are dropped as unknown.
func TestCentralFaults(t *testing.T) {
	port := freePorts(t, 1)
	sink := newModelSink()
	const a = "127.0.0.1:8000"
	sub, reg := runCentral(t, port, func(c *kvevents.Config) {
		c.MaxMessageBytes = 4096
		c.HandshakeTimeout = time.Minute
	}, sink, central(a, 1))

	silent, err := net.Dial("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()

	topic := kvevents.CentralTopic(a, "m")
	p := dialPub(t, port)
	p.awaitSubscribed(sub, topic, a, 0)
	p.send(topic, centralStored(1, 1000)) // ~16 KB of token ids: over the bound
	awaitMetric(t, reg, 1, "kvrouter_kv_events_bad_messages_total", "reason", "too_large")
	p.send(topic, centralStored(7, 1))
	awaitState(t, sink.refSink, a, 0, map[uint64]int{7: 1})
	if st := statusOf(t, sub, a, 0); st.Gaps != 1 || st.Clears[kvevents.ClearGap] != 1 {
		t.Errorf("oversized message not seen as a gap: %+v", st)
	}

	if err := sub.Remove(a); err != nil {
		t.Fatal(err)
	}
	before := testmetrics.Must(t, reg, "kvrouter_kv_events_bad_messages_total", "reason", "unknown_endpoint")
	p.send(topic, centralStored(8, 1))
	awaitMetric(t, reg, before+1, "kvrouter_kv_events_bad_messages_total", "reason", "unknown_endpoint")
	if got := sink.snapshot(a, 0); len(got) != 0 {
		t.Errorf("removed endpoint still holds %v", got)
	}
}

func TestCentralConfig(t *testing.T) {
	tests := []struct {
		name string
		cfg  kvevents.Config
		err  string
	}{
		{"central without bind", kvevents.Config{Endpoints: []kvevents.EndpointConfig{central("10.0.0.1:8000", 1)}}, "no bind address"},
		{"ipc bind", kvevents.Config{Bind: "ipc:///tmp/x"}, "vLLM binds"},
		{"host name bind", kvevents.Config{Bind: "tcp://kvrouter:5557"}, "bind to \"*\" or an IP"},
		{"name not an address", kvevents.Config{Bind: "tcp://*:5557", Endpoints: []kvevents.EndpointConfig{central("pod-a", 1)}}, "must be the ip:port"},
		{"central with address", kvevents.Config{Bind: "tcp://*:5557", Endpoints: []kvevents.EndpointConfig{
			{Name: "10.0.0.1:8000", Central: true, Address: "tcp://10.0.0.1:5557"}}}, "no address to dial"},
		{"ok", kvevents.Config{Bind: "tcp://*:5557", Endpoints: []kvevents.EndpointConfig{central("10.0.0.1:8000", 2)}}, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := kvevents.NewSubscriber(tc.cfg, newRefSink(), nil, nil, nil)
			if tc.err == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if err == nil || !contains(err.Error(), tc.err) {
				t.Fatalf("err = %v, want %q", err, tc.err)
			}
		})
	}
}

func TestCentralBindInUse(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	sub, err := kvevents.NewSubscriber(kvevents.Config{Bind: "tcp://" + l.Addr().String()}, newRefSink(), nil, nil, nil)
	if err != nil {
		t.Fatal(err)
	}
	if err := sub.Run(context.Background()); err == nil || !contains(err.Error(), "address already in use") {
		t.Fatalf("Run = %v, want address in use", err)
	}
}

func TestCentralTopic(t *testing.T) {
	tests := []struct {
		name, topic, addr, model, err string
	}{
		{"round trip", "kv@10.0.0.1:8000@Qwen/Qwen3-0.6B", "10.0.0.1:8000", "Qwen/Qwen3-0.6B", ""},
		{"ipv6, model with @", "kv@[fd00::1]:8000@a@b", "[fd00::1]:8000", "a@b", ""},
		{"no prefix", "x@10.0.0.1:8000@m", "", "", "does not start"},
		{"no model", "kv@10.0.0.1:8000@", "", "", "is not kv@"},
		{"host name", "kv@vllm:8000@m", "", "", "not ip:port"},
		{"port 0", "kv@10.0.0.1:0@m", "", "", "not ip:port"},
		{"zone", "kv@[fe80::1%eth0]:8000@m", "", "", "not ip:port"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			a, m, err := kvevents.ParseCentralTopic(tc.topic)
			if tc.err != "" {
				if err == nil || !contains(err.Error(), tc.err) {
					t.Fatalf("err = %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil || a != tc.addr || m != tc.model {
				t.Errorf("got %q %q %v", a, m, err)
			}
		})
	}
}

func FuzzParseCentralTopic(f *testing.F) {
	f.Add("kv@10.0.0.1:8000@m")
	f.Add("kv@[::1]:1@")
	f.Add("kv@[::ffff:10.0.0.1]:80@x@y")
	f.Fuzz(func(t *testing.T, topic string) {
		a, m, err := kvevents.ParseCentralTopic(topic)
		if err != nil {
			return
		}
		if got := kvevents.CentralTopic(a, m); got != topic {
			t.Errorf("round trip %q -> %q", topic, got)
		}
	})
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func discardLogger() *log.Logger { return log.New(io.Discard, "", 0) }

// TestPerPodEndpointTopic: an endpoint's own topic (over the global one) filters its
// messages (per-pod mode); messages on other topics are dropped, counted, and the last
// such topic is shown, so that a publisher on the wrong topic is visible.
func TestPerPodEndpointTopic(t *testing.T) {
	port := freePorts(t, 1)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	pub := zmq4.NewPub(ctx, zmq4.WithLogger(discardLogger()))
	defer pub.Close()
	if err := pub.Listen(tcp(port)); err != nil {
		t.Fatal(err)
	}
	sink := newModelSink()
	sub := runSubscriber(t, kvevents.Config{Topic: "global", Endpoints: []kvevents.EndpointConfig{
		{Name: "a", Address: tcp(port), Topic: "mine"}}}, sink)
	p := &goPub{t: t, sock: pub}
	p.awaitSubscribed(sub, "mine", "a", 0)
	base := sink.snapshot("a", 0)
	p.sendSeq("other", p.seq, kvevents.Encode(centralStored(500, 1), kvevents.EncodingArray))
	p.sendSeq("global", p.seq, kvevents.Encode(centralStored(501, 1), kvevents.EncodingArray))
	p.send("mine", centralStored(502, 1))
	want := maps.Clone(base)
	want[502]++
	awaitState(t, sink.refSink, "a", 0, want)
	if st := statusOf(t, sub, "a", 0); st.Gaps != 0 || st.Drops != 2 || st.ForeignTopic != "global" ||
		!strings.Contains(st.LastError, `topic "global"`) {
		t.Errorf("other topics: gaps %d drops %d foreign topic %q last error %q; want 0, 2, global, the topic",
			st.Gaps, st.Drops, st.ForeignTopic, st.LastError)
	}
}
