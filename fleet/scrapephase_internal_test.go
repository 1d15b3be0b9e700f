package fleet

import (
	"fmt"
	"testing"
	"time"
)

// TestScrapeOffsetSpreads: a fleet's endpoints get phases spread over the interval, so
// their scrapes do not come in one burst; one address keeps its phase.
func TestScrapeOffsetSpreads(t *testing.T) {
	const n, buckets = 64, 8
	interval := time.Second
	var count [buckets]int
	for i := range n {
		addr := fmt.Sprintf("10.0.%d.%d:8000", i/16, i%16)
		off := scrapeOffset(addr, interval)
		if off < 0 || off >= interval {
			t.Fatalf("%s: offset %v outside [0, %v)", addr, off, interval)
		}
		if again := scrapeOffset(addr, interval); again != off {
			t.Fatalf("%s: offset %v then %v", addr, off, again)
		}
		count[int(off*buckets/interval)]++
	}
	for b, c := range count {
		// Even spread is 8 a bucket; a burst would put most of them in one.
		if c > 3*n/buckets {
			t.Errorf("bucket %d of %d holds %d of %d endpoints: %v", b, buckets, c, n, count)
		}
	}
	if got := scrapeOffset("x", 0); got != 0 {
		t.Errorf("zero interval: offset %v", got)
	}
}
