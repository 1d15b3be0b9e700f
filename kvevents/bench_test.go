package kvevents_test

import (
	"context"
	"encoding/binary"
	"os"
	"sync/atomic"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/cputime"
	"github.com/kvrouter/kvrouter/kvevents"
)

// BenchmarkDecode decodes realistic batches (Python-produced: 20 BlockStored events of 17
// blocks, 340 blocks and 5,440 token ids, ~20 KB) and reports blocks/s.
func BenchmarkDecode(b *testing.B) {
	for _, name := range []string{"array_realistic", "map_realistic"} {
		payload, err := os.ReadFile("testdata/golden/" + name + ".msgpack")
		if err != nil {
			b.Fatal(err)
		}
		b.Run(name, func(b *testing.B) {
			var batch kvevents.Batch
			if err := kvevents.Decode(payload, &batch); err != nil {
				b.Fatal(err)
			}
			blocks := 0
			for _, ev := range batch.Events {
				if s, ok := ev.(*kvevents.BlockStored); ok {
					blocks += len(s.BlockHashes)
				}
			}
			b.SetBytes(int64(len(payload)))
			b.ReportAllocs()
			b.ResetTimer()
			cpu0 := cputime.Process()
			for b.Loop() {
				if err := kvevents.Decode(payload, &batch); err != nil {
					b.Fatal(err)
				}
			}
			cpu := cputime.Process() - cpu0
			b.ReportMetric(float64(blocks*b.N)/b.Elapsed().Seconds(), "blocks/s")
			b.ReportMetric(float64(blocks*b.N)/cpu.Seconds(), "blocks/cpu-s")
			b.ReportMetric(float64(len(batch.Events)*b.N)/b.Elapsed().Seconds(), "events/s")
		})
	}
}

// BenchmarkDecodeFresh decodes into a new Batch every time (no reuse): the cost a caller
// pays when it keeps every batch.
func BenchmarkDecodeFresh(b *testing.B) {
	payload, err := os.ReadFile("testdata/golden/array_realistic.msgpack")
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	for b.Loop() {
		var batch kvevents.Batch
		if err := kvevents.Decode(payload, &batch); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(340*b.N)/b.Elapsed().Seconds(), "blocks/s")
}

func BenchmarkEncode(b *testing.B) {
	payload, err := os.ReadFile("testdata/golden/map_realistic.msgpack")
	if err != nil {
		b.Fatal(err)
	}
	var batch kvevents.Batch
	if err := kvevents.Decode(payload, &batch); err != nil {
		b.Fatal(err)
	}
	for _, enc := range []kvevents.Encoding{kvevents.EncodingArray, kvevents.EncodingMap} {
		b.Run(enc.String(), func(b *testing.B) {
			buf := make([]byte, 0, 64<<10)
			b.ReportAllocs()
			for b.Loop() {
				buf = kvevents.AppendEncode(buf[:0], &batch, enc)
			}
			b.SetBytes(int64(len(buf)))
			b.ReportMetric(float64(340*b.N)/b.Elapsed().Seconds(), "blocks/s")
		})
	}
}

// countSink counts applied batches and blocks and signals when want batches arrived.
type countSink struct {
	batches, blocks atomic.Int64
	want            int64
	done            chan struct{}
}

func (s *countSink) Apply(_ string, _ int, b *kvevents.Batch) {
	for _, ev := range b.Events {
		if st, ok := ev.(*kvevents.BlockStored); ok {
			s.blocks.Add(int64(len(st.BlockHashes)))
		}
	}
	if s.batches.Add(1) == s.want {
		close(s.done)
	}
}

func (s *countSink) Clear(string, int) {}

// BenchmarkSubscriberThroughput: realistic batches (20 KB, 340 blocks) written over
// loopback TCP by a fake PUB as fast as it can, received, framed, decoded and applied by
// the subscriber to a counting Sink. One op is one batch.
func BenchmarkSubscriberThroughput(b *testing.B) {
	payload, err := os.ReadFile("testdata/golden/array_realistic.msgpack")
	if err != nil {
		b.Fatal(err)
	}
	t := &testing.T{}
	pub := newFakePub(t, "127.0.0.1:0")
	defer pub.close()
	sink := &countSink{want: int64(b.N) + 1, done: make(chan struct{})}
	sub, err := kvevents.NewSubscriber(kvevents.Config{Endpoints: []kvevents.EndpointConfig{
		{Name: "pod", Address: pub.addr()}}}, sink, nil, nil, nil)
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	runDone := make(chan error, 1)
	go func() { runDone <- sub.Run(ctx) }()
	defer func() { cancel(); <-runDone }()
	c := pub.next(t)
	// Seq 0 first, outside the timer: the stream is live once it is applied.
	if err := c.send([]byte{}, binary.BigEndian.AppendUint64(nil, 0), payload); err != nil {
		b.Fatal(err)
	}
	for sink.batches.Load() < 1 {
		time.Sleep(time.Millisecond)
	}
	blocks0 := sink.blocks.Load()
	b.SetBytes(int64(len(payload)))
	b.ReportAllocs()
	b.ResetTimer()
	cpu0 := cputime.Process()
	go func() {
		var buf []byte
		for i := 1; i <= b.N; i++ {
			buf = zmtpMessage(buf, []byte{}, binary.BigEndian.AppendUint64(nil, uint64(i)), payload)
			if len(buf) >= 256<<10 || i == b.N {
				if c.write(buf) != nil {
					return
				}
				buf = buf[:0]
			}
		}
	}()
	select {
	case <-sink.done:
	case <-time.After(5 * time.Minute):
		b.Fatalf("only %d of %d batches applied", sink.batches.Load()-1, b.N)
	}
	b.StopTimer()
	cpu := cputime.Process() - cpu0
	blocks := float64(sink.blocks.Load() - blocks0)
	b.ReportMetric(blocks/b.Elapsed().Seconds(), "blocks/s")
	b.ReportMetric(blocks/cpu.Seconds(), "blocks/cpu-s")
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "batches/s")
}
