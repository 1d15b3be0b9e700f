package sim_test

import (
	"fmt"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/testbench/sim"
)

// Two requests share a 32-token prefix: the second finds it cached and the engine
// publishes only the blocks it computed.
func ExampleEngine() {
	e, _ := sim.New(sim.DefaultConfig())
	prefix := make([]uint32, 32)
	for i := range prefix {
		prefix[i] = uint32(1000 + i)
	}
	for _, id := range []string{"first", "second"} {
		prompt := append(append([]uint32{}, prefix...), 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 18, 19, 20, 21, 22, 23)
		prompt[32] += uint32(len(id)) // the tails differ from their first token
		_ = e.AddRequest(id, prompt, 2, sim.Callbacks{
			Finish: func(r sim.Result) {
				fmt.Printf("%s: %d of %d prompt tokens cached\n", r.ID, r.CachedTokens, r.PromptTokens)
			},
		})
		for e.HasWork() {
			for _, ev := range e.Step().Events {
				if s, ok := ev.(*kvevents.BlockStored); ok {
					fmt.Printf("BlockStored %d blocks, parent %v\n", len(s.BlockHashes), s.HasParent)
				}
			}
		}
	}
	// Output:
	// BlockStored 3 blocks, parent false
	// first: 0 of 49 prompt tokens cached
	// BlockStored 1 blocks, parent true
	// second: 32 of 49 prompt tokens cached
}
