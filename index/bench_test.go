package index_test

import (
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"syscall"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/index"
)

const (
	benchBlock     = 16
	batchBlocks    = 340 // a realistic vLLM batch: ~19.6 KB, ~340 blocks
	requestBlocks  = 148 // 2,371 prompt tokens in the reference experiment
	benchEndpoints = 64
	blocksPerEP    = 50_000
)

func randTokens(rng *rand.Rand, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = rng.Uint32N(150_000)
	}
	return t
}

// batches returns n chained BlockStored payloads of batchBlocks blocks each, every one a
// new sequence with its own handles.
func batches(rng *rand.Rand, n int) []index.Blocks {
	out := make([]index.Blocks, n)
	for i := range out {
		h := make([]uint64, batchBlocks)
		for j := range h {
			h[j] = rng.Uint64()
		}
		out[i] = index.Blocks{Root: root, Handles: h, Tokens: randTokens(rng, batchBlocks*benchBlock), BlockSize: benchBlock}
	}
	return out
}

// cpuTime is the process's user+system CPU time: on a shared machine wall time also
// counts the time other processes held the core.
func cpuTime() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// reportRate reports blocks per wall second and per CPU second since cpu0.
func reportRate(b *testing.B, blocks int, cpu0 time.Duration) {
	b.ReportMetric(float64(blocks)/b.Elapsed().Seconds(), "blocks/s")
	if d := cpuTime() - cpu0; d > 0 {
		b.ReportMetric(float64(blocks)/d.Seconds(), "blocks/cpu-s")
	}
}

// BenchmarkStore indexes realistic batches into one endpoint rank held at 50k blocks by the
// matching removals (steady state: every batch stored evicts an old one through
// BlockRemoved). blocks/s counts stored blocks; each also costs one removal.
func BenchmarkStore(b *testing.B) {
	ix := newIndex(b, nil)
	rng := rand.New(rand.NewPCG(1, 2))
	const window = blocksPerEP / batchBlocks
	bs := batches(rng, 2*window)
	for i := range window {
		mustStore(b, ix, "A", 0, bs[i])
	}
	cpu := cpuTime()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		cur := bs[(i+window)%len(bs)]
		old := bs[i%len(bs)]
		mustStore(b, ix, "A", 0, cur)
		ix.Remove("A", 0, old.Handles)
	}
	reportRate(b, b.N*batchBlocks, cpu)
}

// BenchmarkStoreEvicting indexes batches into a rank at its 50k-block cap with no
// removals, so every stored block evicts the oldest one.
func BenchmarkStoreEvicting(b *testing.B) {
	ix := newIndex(b, func(c *index.Config) { c.Headroom = 1 })
	ix.SetCapacity("A", blocksPerEP)
	rng := rand.New(rand.NewPCG(1, 2))
	bs := batches(rng, 2*blocksPerEP/batchBlocks)
	for i := range bs {
		mustStore(b, ix, "A", 0, bs[i])
	}
	cpu := cpuTime()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		mustStore(b, ix, "A", 0, bs[i%len(bs)])
	}
	reportRate(b, b.N*batchBlocks, cpu)
}

// fleet fills an index with 64 endpoints x 50k blocks. shared of every endpoint's
// sequences start with one of 24 common 127-block prefixes (as the reference workload's
// prompts do); the rest are distinct. It returns the index and a request of 148 blocks
// whose first 127 are one of the shared prefixes.
func fleet(tb testing.TB, shared bool) (*index.Index, []uint64, []string) {
	ix := newIndex(tb, nil)
	rng := rand.New(rand.NewPCG(3, 4))
	prefixes := make([][]uint32, 24)
	for i := range prefixes {
		prefixes[i] = randTokens(rng, 127*benchBlock)
	}
	eps := make([]string, benchEndpoints)
	for e := range eps {
		eps[e] = fmt.Sprintf("10.0.%d.%d:8000", e/256, e%256)
		p := pod{uint64(e) + 1}
		held := map[int]bool{}
		for n := 0; n < blocksPerEP; {
			blocks := min(requestBlocks, blocksPerEP-n)
			tokens := randTokens(rng, blocks*benchBlock)
			from := 0
			if shared && blocks == requestBlocks {
				pi := rng.IntN(len(prefixes))
				copy(tokens, prefixes[pi])
				if held[pi] { // the prefix is already held: store only the tail
					from = 127
				}
				held[pi] = true
			}
			h := p.handles(tokens)
			for i := range h {
				h[i] ^= uint64(n) << 20 // distinct handles per sequence
			}
			if from > 0 {
				// store the tail as a new sequence from the prefix's key (handles unknown
				// here), so that the rank holds only its own blocks
				b := index.Blocks{Root: index.Keys(root, tokens[:from*benchBlock], benchBlock, nil)[from-1],
					Handles: h[from:blocks], Tokens: tokens[from*benchBlock : blocks*benchBlock], BlockSize: benchBlock}
				mustStore(tb, ix, eps[e], 0, b)
				n += blocks - from
				continue
			}
			mustStore(tb, ix, eps[e], 0, index.Blocks{Root: root, Handles: h[:blocks], Tokens: tokens, BlockSize: benchBlock})
			n += blocks
		}
	}
	req := append(slices.Clone(prefixes[0]), randTokens(rng, 21*benchBlock)...)
	return ix, index.Keys(root, req, benchBlock, nil), eps
}

// BenchmarkLeadingBlocks looks up a 148-block request over 64 endpoints holding 50k blocks
// each; the request's 127-block prefix is held by the endpoints that served it.
func BenchmarkLeadingBlocks(b *testing.B) {
	for _, shared := range []bool{true, false} {
		b.Run(fmt.Sprintf("shared=%v", shared), func(b *testing.B) {
			ix, keys, eps := fleet(b, shared)
			dst := ix.LeadingBlocks(keys, eps, nil)
			holders := 0
			for _, d := range dst {
				if d > 0 {
					holders++
				}
			}
			lat := make([]time.Duration, 0, 1<<16)
			b.ResetTimer()
			for b.Loop() {
				t0 := time.Now()
				dst = ix.LeadingBlocks(keys, eps, dst)
				if len(lat) < cap(lat) {
					lat = append(lat, time.Since(t0))
				}
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
			b.ReportMetric(float64(holders), "holders")
		})
	}
}

// BenchmarkMemory reports the heap held per (block, endpoint) entry with 64 endpoints x
// 50k blocks: distinct blocks everywhere (the worst case: no key is shared) and the
// reference workload's shape (every endpoint holds some of 24 shared 127-block prefixes).
func BenchmarkMemory(b *testing.B) {
	for _, shared := range []bool{false, true} {
		b.Run(fmt.Sprintf("shared=%v", shared), func(b *testing.B) {
			for b.Loop() {
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				ix, _, _ := fleet(b, shared)
				runtime.GC()
				runtime.ReadMemStats(&after)
				blocks, keys := ix.Len()
				heap := float64(after.HeapAlloc) - float64(before.HeapAlloc)
				b.ReportMetric(heap/float64(blocks), "bytes/entry")
				b.ReportMetric(heap/(1<<20), "heap-MiB")
				b.ReportMetric(float64(blocks), "entries")
				b.ReportMetric(float64(keys), "keys")
				runtime.KeepAlive(ix)
			}
		})
	}
}

// BenchmarkLeadingBlocksDuringIngest times lookups (as BenchmarkLeadingBlocks, shared
// prefixes) while another goroutine ingests batches for one of the endpoints without
// pause. Run it with -cpu 2 or more: with one, the two merely take turns.
func BenchmarkLeadingBlocksDuringIngest(b *testing.B) {
	ix, keys, eps := fleet(b, true)
	rng := rand.New(rand.NewPCG(9, 9))
	bs := batches(rng, 64)
	stop := make(chan struct{})
	done := make(chan int)
	go func() {
		n := 0
		for i := 0; ; i++ {
			select {
			case <-stop:
				done <- n
				return
			default:
			}
			_ = ix.Store(eps[1], 0, bs[i%len(bs)])
			ix.Remove(eps[1], 0, bs[(i+32)%len(bs)].Handles)
			n += batchBlocks
		}
	}()
	lat := make([]time.Duration, 0, 1<<16)
	var dst []int
	b.ResetTimer()
	for b.Loop() {
		t0 := time.Now()
		dst = ix.LeadingBlocks(keys, eps, dst)
		if len(lat) < cap(lat) {
			lat = append(lat, time.Since(t0))
		}
	}
	b.StopTimer()
	close(stop)
	ingested := <-done
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
	b.ReportMetric(float64(lat[len(lat)*999/1000].Nanoseconds()), "p999-ns")
	b.ReportMetric(float64(ingested)/b.Elapsed().Seconds(), "ingested-blocks/s")
}

// BenchmarkLeadingBlocksLong looks up a 128k-token conversation's 8,100 blocks (keys
// 8,100, as the kv policy looks them up, and 4,097, as placement does) over 8 endpoints
// holding 20k blocks each: one holds the whole conversation, the others its first 25
// blocks (a system prompt every conversation shares).
func BenchmarkLeadingBlocksLong(b *testing.B) {
	ix := newIndex(b, nil)
	rng := rand.New(rand.NewPCG(5, 6))
	conv := randTokens(rng, 8100*benchBlock)
	eps := make([]string, 8)
	for e := range eps {
		eps[e] = fmt.Sprintf("10.0.0.%d:8000", e+1)
		p := pod{uint64(e) + 1}
		mine := conv[:25*benchBlock]
		if e == 0 {
			mine = conv
		}
		n := len(mine) / benchBlock
		mustStore(b, ix, eps[e], 0, index.Blocks{Root: root, Handles: p.handles(mine)[:n], Tokens: mine, BlockSize: benchBlock})
		for n < 20_000 {
			tokens := randTokens(rng, 1000*benchBlock)
			h := p.handles(tokens)[:1000] // pod's handles are per 4 tokens: any distinct ones do
			for i := range h {
				h[i] ^= uint64(n) << 20 // distinct handles per sequence
			}
			mustStore(b, ix, eps[e], 0, index.Blocks{Root: root, Handles: h, Tokens: tokens, BlockSize: benchBlock})
			n += len(h)
		}
	}
	keys := index.Keys(root, conv, benchBlock, nil)
	for _, look := range []int{len(keys), 4097} {
		b.Run(fmt.Sprintf("keys=%d", look), func(b *testing.B) {
			dst := ix.LeadingBlocks(keys[:look], eps, nil)
			if dst[0] != look || dst[1] != 25 {
				b.Fatalf("leading blocks %v", dst)
			}
			lat := make([]time.Duration, 0, 1<<16)
			for b.Loop() {
				t0 := time.Now()
				dst = ix.LeadingBlocks(keys[:look], eps, dst)
				if len(lat) < cap(lat) {
					lat = append(lat, time.Since(t0))
				}
			}
			slices.Sort(lat)
			b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
			b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
		})
	}
}
