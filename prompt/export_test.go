package prompt

import (
	"sync/atomic"

	"github.com/kvrouter/kvrouter/chattemplate"
)

// deferredPoisoned counts the bytes renders deferred, which every test of the package
// overwrites with invalid UTF-8 before they are encoded (see testHookDeferred): a
// tokenizer reading a deferred byte it did not have filled would then give ids that
// differ from the uncached builders' the tests compare with.
var deferredPoisoned atomic.Int64

func init() {
	testHookDeferred = func(rendered []byte, prov *chattemplate.Provenance) {
		deferredPoisoned.Add(int64(prov.DeferredBytes()))
		prov.Poison(rendered, 0xff)
	}
}

// DeferredPoisoned returns how many deferred bytes the package's tests poisoned so far.
func DeferredPoisoned() int64 { return deferredPoisoned.Load() }
