package kvevents_test

import (
	"os"
	"testing"

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
