package kvevents_test

import (
	"fmt"

	"github.com/kvrouter/kvrouter/kvevents"
)

// A simulator publishes with Encode; the router decodes with Decode, reusing one Batch.
func ExampleDecode() {
	payload := kvevents.Encode(&kvevents.Batch{
		TS: 1764412345.5, DPRank: 0, HasDPRank: true,
		Events: []kvevents.Event{
			&kvevents.BlockStored{BlockHashes: []uint64{0xabc}, TokenIDs: make([]uint32, 16),
				BlockSize: 16, Medium: "GPU"},
			&kvevents.BlockRemoved{BlockHashes: []uint64{0x123}, Medium: "GPU"},
		},
	}, kvevents.EncodingMap)

	var b kvevents.Batch
	if err := kvevents.Decode(payload, &b); err != nil {
		fmt.Println(err)
		return
	}
	for _, ev := range b.Events {
		switch ev := ev.(type) {
		case *kvevents.BlockStored:
			fmt.Printf("stored %x (parent %v), %d tokens\n", ev.BlockHashes, ev.HasParent, len(ev.TokenIDs))
		case *kvevents.BlockRemoved:
			fmt.Printf("removed %x\n", ev.BlockHashes)
		}
	}
	// Output:
	// stored [abc] (parent false), 16 tokens
	// removed [123]
}

func ExampleDecodeError() {
	var b kvevents.Batch
	err := kvevents.Decode([]byte{0x92, 0xcb, 0x41}, &b) // cut inside the timestamp
	fmt.Println(err)
	// Output: kvevents: decode: truncated at offset 2
}
