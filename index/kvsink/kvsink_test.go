package kvsink_test

import (
	"os"
	"slices"
	"testing"

	"github.com/kvrouter/kvrouter/index"
	"github.com/kvrouter/kvrouter/index/kvsink"
	"github.com/kvrouter/kvrouter/internal/cputime"
	"github.com/kvrouter/kvrouter/kvevents"
)

func toks(start, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(start + i)
	}
	return t
}

// salted sets the first block's extra_keys to vLLM's [(salt,)] shape, msgpack-encoded.
func salted(salt string) func(*kvevents.BlockStored) {
	return func(e *kvevents.BlockStored) {
		e.ExtraKeys = append([]byte{0x91, 0x91, 0xa0 | byte(len(salt))}, salt...)
	}
}

func TestApply(t *testing.T) {
	prompt := toks(0, 64)
	stored := func(from, to int, mut func(*kvevents.BlockStored)) *kvevents.BlockStored {
		e := &kvevents.BlockStored{BlockHashes: []uint64{}, TokenIDs: prompt[from*16 : to*16], BlockSize: 16}
		for i := from; i < to; i++ {
			e.BlockHashes = append(e.BlockHashes, uint64(100+i))
		}
		if from > 0 {
			e.ParentHash, e.HasParent = uint64(100+from-1), true
		}
		if mut != nil {
			mut(e)
		}
		return e
	}
	tests := []struct {
		name   string
		events []kvevents.Event
		model  string
		lora   string
		want   int
		salt   string
	}{
		{"stored blocks chain across events", []kvevents.Event{stored(0, 2, nil), stored(2, 4, nil)}, "m", "", 4, ""},
		{"the endpoint's model roots the keys", []kvevents.Event{stored(0, 4, nil)}, "other", "", 0, ""},
		{"removal ends the run", []kvevents.Event{stored(0, 4, nil), &kvevents.BlockRemoved{BlockHashes: []uint64{102}}}, "m", "", 2, ""},
		{"all blocks cleared", []kvevents.Event{stored(0, 4, nil), &kvevents.AllBlocksCleared{}}, "m", "", 0, ""},
		{"CPU blocks are not indexed", []kvevents.Event{stored(0, 4, func(e *kvevents.BlockStored) { e.Medium = "CPU" })}, "m", "", 0, ""},
		{"GPU medium is indexed", []kvevents.Event{stored(0, 4, func(e *kvevents.BlockStored) { e.Medium = "GPU" })}, "m", "", 4, ""},
		{"removals of CPU copies leave GPU blocks", []kvevents.Event{stored(0, 4, nil),
			&kvevents.BlockRemoved{BlockHashes: []uint64{100}, Medium: "CPU"}}, "m", "", 4, ""},
		{"other KV-cache groups are skipped", []kvevents.Event{stored(0, 4, nil), stored(0, 4, func(e *kvevents.BlockStored) { e.GroupIdx = 1 }),
			&kvevents.BlockRemoved{BlockHashes: []uint64{101}, GroupIdx: 1}}, "m", "", 4, ""},
		{"LoRA blocks match LoRA requests", []kvevents.Event{stored(0, 4, func(e *kvevents.BlockStored) { e.LoRAName = "ad" })}, "m", "ad", 4, ""},
		{"LoRA blocks do not match base requests", []kvevents.Event{stored(0, 4, func(e *kvevents.BlockStored) { e.LoRAName = "ad" })}, "m", "", 0, ""},
		{"a LoRA known by id only matches nothing", []kvevents.Event{stored(0, 4, func(e *kvevents.BlockStored) { e.LoRAID, e.HasLoRAID = 3, true })}, "m", "", 0, ""},
		{"an orphan does not stop the batch", []kvevents.Event{stored(3, 4, nil), stored(0, 2, nil)}, "m", "", 2, ""},
		{"salted blocks match requests with that salt", []kvevents.Event{stored(0, 4, salted("s1"))}, "m", "", 4, "s1"},
		{"salted blocks do not match unsalted requests", []kvevents.Event{stored(0, 4, salted("s1"))}, "m", "", 0, ""},
		{"unsalted blocks do not match salted requests", []kvevents.Event{stored(0, 4, nil)}, "m", "", 0, "s1"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			ix, err := index.New(index.DefaultConfig(), nil)
			if err != nil {
				t.Fatal(err)
			}
			s, err := kvsink.New(ix, func(string) string { return tc.model }, kvsink.DefaultConfig(), nil)
			if err != nil {
				t.Fatal(err)
			}
			s.Apply("A", 0, &kvevents.Batch{Events: tc.events})
			keys := index.Keys(index.Root("m", tc.lora, tc.salt), prompt, 16, nil)
			if got := ix.LeadingBlocks(keys, []string{"A"}, nil); !slices.Equal(got, []int{tc.want}) {
				t.Fatalf("LeadingBlocks = %v, want [%d]", got, tc.want)
			}
		})
	}
}

func TestClear(t *testing.T) {
	ix, _ := index.New(index.DefaultConfig(), nil)
	s, _ := kvsink.New(ix, func(string) string { return "m" }, kvsink.DefaultConfig(), nil)
	s.Apply("A", 1, &kvevents.Batch{Events: []kvevents.Event{&kvevents.BlockStored{
		BlockHashes: []uint64{1}, TokenIDs: toks(0, 16), BlockSize: 16}}})
	s.Apply("A", 1, nil)
	s.Clear("A", 1)
	if blocks, _ := ix.Len(); blocks != 0 {
		t.Fatalf("%d blocks after Clear", blocks)
	}
}

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  kvsink.Config
		ok   bool
	}{
		{"default", kvsink.DefaultConfig(), true},
		{"no media", kvsink.Config{}, false},
		{"negative group", kvsink.Config{Media: []string{"GPU"}, Group: -1}, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if err := tc.cfg.Validate(); (err == nil) != tc.ok {
				t.Fatalf("Validate() = %v", err)
			}
		})
	}
}

// BenchmarkStoreRemoveCycle is the KV-event path from wire to index and back: decode a
// realistic stored batch (kvevents' golden array_realistic: 20 BlockStored events, 340
// blocks), apply it, decode the batch of 340 BlockRemoved events for the same blocks and
// apply that. It reports block store+remove cycles per CPU-second.
func BenchmarkStoreRemoveCycle(b *testing.B) {
	stored, err := os.ReadFile("../../kvevents/testdata/golden/array_realistic.msgpack")
	if err != nil {
		b.Fatal(err)
	}
	var batch kvevents.Batch
	if err := kvevents.Decode(stored, &batch); err != nil {
		b.Fatal(err)
	}
	rm := &kvevents.BlockRemoved{}
	for _, ev := range batch.Events {
		if s, ok := ev.(*kvevents.BlockStored); ok {
			rm.BlockHashes = append(rm.BlockHashes, s.BlockHashes...)
		}
	}
	removed := kvevents.Encode(&kvevents.Batch{TS: batch.TS, Events: []kvevents.Event{rm}}, kvevents.EncodingArray)
	ix, err := index.New(index.DefaultConfig(), nil)
	if err != nil {
		b.Fatal(err)
	}
	sink, err := kvsink.New(ix, func(string) string { return "m" }, kvsink.DefaultConfig(), nil)
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	cpu0 := cputime.Process()
	for b.Loop() {
		if err := kvevents.Decode(stored, &batch); err != nil {
			b.Fatal(err)
		}
		sink.Apply("10.0.0.1:8000", 0, &batch)
		if err := kvevents.Decode(removed, &batch); err != nil {
			b.Fatal(err)
		}
		sink.Apply("10.0.0.1:8000", 0, &batch)
	}
	b.ReportMetric(float64(len(rm.BlockHashes)*b.N)/(cputime.Process()-cpu0).Seconds(), "cycles/cpu-s")
}
