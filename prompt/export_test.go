package prompt

import (
	"flag"
	"os"
	"sync/atomic"
	"testing"

	"github.com/kvrouter/kvrouter/chattemplate"
)

// deferredPoisoned counts the bytes renders deferred, which the package's tests
// overwrite with invalid UTF-8 before they are encoded (see testHookDeferred): a
// tokenizer reading a deferred byte it did not have filled would then give ids that
// differ from the uncached builders' the tests compare with.
var deferredPoisoned atomic.Int64

// TestMain poisons the deferred bytes unless benchmarks run (which measure the
// Builder as it ships).
func TestMain(m *testing.M) {
	flag.Parse()
	if f := flag.Lookup("test.bench"); f == nil || f.Value.String() == "" {
		testHookDeferred = func(rendered []byte, prov *chattemplate.Provenance) {
			deferredPoisoned.Add(int64(prov.DeferredBytes()))
			prov.Poison(rendered, 0xff)
		}
	}
	os.Exit(m.Run())
}

// DeferredPoisoned returns how many deferred bytes the package's tests poisoned so far.
func DeferredPoisoned() int64 { return deferredPoisoned.Load() }

// DeferredPoisoning reports whether the tests poison the deferred bytes (not when
// benchmarks run).
func DeferredPoisoning() bool { return testHookDeferred != nil }
