package kvevents

import (
	"encoding/binary"
	"math"
)

// Encoding selects how Encode lays out a batch.
type Encoding int

const (
	// EncodingArray is vLLM's positional encoding up to 0.23 (msgspec array_like=True,
	// omit_defaults=True): the batch as [ts, events] or [ts, events, dp_rank], each event
	// as [tag, fields...] with trailing fields at their default (nil) omitted.
	EncodingArray Encoding = iota
	// EncodingMap is vLLM's encoding since mid-2026 (PR 42892): maps with the tag under
	// "type" first, fields by name in declaration order, defaulted optional fields omitted.
	EncodingMap
)

// String names the encoding as configuration spells it ("array", "map").
func (e Encoding) String() string {
	if e == EncodingMap {
		return "map"
	}
	return "array"
}

// Encode returns b as vLLM's msgspec encoder would emit it, byte for byte, in the chosen
// encoding. See AppendEncode.
func Encode(b *Batch, enc Encoding) []byte {
	return AppendEncode(nil, b, enc)
}

// AppendEncode appends the encoding of b to dst and returns the extended slice.
//
// Fields map back to vLLM's: a Has* flag false, an empty string or an empty ExtraKeys is
// nil; BlockHashes are written as unsigned integers (vLLM's default int hashes). Optional
// fields (extra_keys, group_idx, kv_cache_spec_kind, kv_cache_spec_sliding_window for
// BlockStored; group_idx for BlockRemoved) are omitted when nil: all of them in the map
// encoding, the trailing ones in the array encoding, as msgspec's omit_defaults does.
// ExtraKeys must hold one valid msgpack value; it is written verbatim. The batch's
// data_parallel_rank is omitted when HasDPRank is false. Events of other types than the
// three vLLM defines are skipped.
func AppendEncode(dst []byte, b *Batch, enc Encoding) []byte {
	e := encoder{b: dst}
	n := 0
	for _, ev := range b.Events {
		switch ev.(type) {
		case *BlockStored, *BlockRemoved, *AllBlocksCleared:
			n++
		}
	}
	if enc == EncodingMap {
		if b.HasDPRank {
			e.mapHeader(3)
		} else {
			e.mapHeader(2)
		}
		e.str("ts")
		e.float(b.TS)
		e.str("events")
	} else {
		if b.HasDPRank {
			e.arrayHeader(3)
		} else {
			e.arrayHeader(2)
		}
		e.float(b.TS)
	}
	e.arrayHeader(n)
	for _, ev := range b.Events {
		switch ev := ev.(type) {
		case *BlockStored:
			e.stored(ev, enc)
		case *BlockRemoved:
			e.removed(ev, enc)
		case *AllBlocksCleared:
			if enc == EncodingMap {
				e.mapHeader(1)
				e.str("type")
			} else {
				e.arrayHeader(1)
			}
			e.str("AllBlocksCleared")
		}
	}
	if b.HasDPRank {
		if enc == EncodingMap {
			e.str("data_parallel_rank")
		}
		e.int(int64(b.DPRank))
	}
	return e.b
}

type encoder struct{ b []byte }

func (e *encoder) stored(s *BlockStored, enc Encoding) {
	// Optional fields, in declaration order, and whether each is set.
	opt := [4]bool{len(s.ExtraKeys) > 0, s.HasGroupIdx, s.KVCacheSpecKind != "", s.HasSlidingWindow}
	const required = 8 // tag + 7 fields without defaults
	if enc == EncodingMap {
		n := required
		for _, set := range opt {
			if set {
				n++
			}
		}
		e.mapHeader(n)
		e.str("type")
	} else {
		last := -1
		for i, set := range opt {
			if set {
				last = i
			}
		}
		e.arrayHeader(required + last + 1)
	}
	m := enc == EncodingMap
	e.str("BlockStored")
	e.key(m, "block_hashes")
	e.hashes(s.BlockHashes)
	e.key(m, "parent_block_hash")
	if s.HasParent {
		e.uint(s.ParentHash)
	} else {
		e.nil()
	}
	e.key(m, "token_ids")
	e.arrayHeader(len(s.TokenIDs))
	for _, t := range s.TokenIDs {
		e.uint(uint64(t))
	}
	e.key(m, "block_size")
	e.int(int64(s.BlockSize))
	e.key(m, "lora_id")
	if s.HasLoRAID {
		e.int(s.LoRAID)
	} else {
		e.nil()
	}
	e.key(m, "medium")
	e.optStr(s.Medium)
	e.key(m, "lora_name")
	e.optStr(s.LoRAName)
	// Array encoding: every optional field up to the last set one; map: only set ones.
	emit := func(i int) bool {
		if m {
			return opt[i]
		}
		for j := i; j < len(opt); j++ {
			if opt[j] {
				return true
			}
		}
		return false
	}
	if emit(0) {
		e.key(m, "extra_keys")
		if opt[0] {
			e.b = append(e.b, s.ExtraKeys...)
		} else {
			e.nil()
		}
	}
	if emit(1) {
		e.key(m, "group_idx")
		e.optInt(s.HasGroupIdx, int64(s.GroupIdx))
	}
	if emit(2) {
		e.key(m, "kv_cache_spec_kind")
		e.optStr(s.KVCacheSpecKind)
	}
	if emit(3) {
		e.key(m, "kv_cache_spec_sliding_window")
		e.optInt(s.HasSlidingWindow, int64(s.KVCacheSpecSlidingWindow))
	}
}

func (e *encoder) removed(r *BlockRemoved, enc Encoding) {
	m := enc == EncodingMap
	n := 3
	if r.HasGroupIdx {
		n = 4
	}
	if m {
		e.mapHeader(n)
		e.str("type")
	} else {
		e.arrayHeader(n)
	}
	e.str("BlockRemoved")
	e.key(m, "block_hashes")
	e.hashes(r.BlockHashes)
	e.key(m, "medium")
	e.optStr(r.Medium)
	if r.HasGroupIdx {
		e.key(m, "group_idx")
		e.int(int64(r.GroupIdx))
	}
}

func (e *encoder) key(m bool, k string) {
	if m {
		e.str(k)
	}
}

func (e *encoder) hashes(hs []uint64) {
	e.arrayHeader(len(hs))
	for _, h := range hs {
		e.uint(h)
	}
}

func (e *encoder) nil() { e.b = append(e.b, 0xc0) }

func (e *encoder) optStr(s string) {
	if s == "" {
		e.nil()
		return
	}
	e.str(s)
}

func (e *encoder) optInt(set bool, v int64) {
	if !set {
		e.nil()
		return
	}
	e.int(v)
}

func (e *encoder) float(f float64) {
	e.b = append(e.b, 0xcb)
	e.b = binary.BigEndian.AppendUint64(e.b, math.Float64bits(f))
}

// uint writes v in the smallest form, as msgspec and msgpack-python do.
func (e *encoder) uint(v uint64) {
	switch {
	case v <= 0x7f:
		e.b = append(e.b, byte(v))
	case v <= math.MaxUint8:
		e.b = append(e.b, 0xcc, byte(v))
	case v <= math.MaxUint16:
		e.b = append(e.b, 0xcd)
		e.b = binary.BigEndian.AppendUint16(e.b, uint16(v))
	case v <= math.MaxUint32:
		e.b = append(e.b, 0xce)
		e.b = binary.BigEndian.AppendUint32(e.b, uint32(v))
	default:
		e.b = append(e.b, 0xcf)
		e.b = binary.BigEndian.AppendUint64(e.b, v)
	}
}

// int writes v in the smallest form: unsigned forms for non-negative values.
func (e *encoder) int(v int64) {
	switch {
	case v >= 0:
		e.uint(uint64(v))
	case v >= -32:
		e.b = append(e.b, byte(int8(v)))
	case v >= math.MinInt8:
		e.b = append(e.b, 0xd0, byte(int8(v)))
	case v >= math.MinInt16:
		e.b = append(e.b, 0xd1)
		e.b = binary.BigEndian.AppendUint16(e.b, uint16(int16(v)))
	case v >= math.MinInt32:
		e.b = append(e.b, 0xd2)
		e.b = binary.BigEndian.AppendUint32(e.b, uint32(int32(v)))
	default:
		e.b = append(e.b, 0xd3)
		e.b = binary.BigEndian.AppendUint64(e.b, uint64(v))
	}
}

func (e *encoder) str(s string) {
	n := len(s)
	switch {
	case n <= 31:
		e.b = append(e.b, 0xa0|byte(n))
	case n <= math.MaxUint8:
		e.b = append(e.b, 0xd9, byte(n))
	case n <= math.MaxUint16:
		e.b = append(e.b, 0xda)
		e.b = binary.BigEndian.AppendUint16(e.b, uint16(n))
	default:
		e.b = append(e.b, 0xdb)
		e.b = binary.BigEndian.AppendUint32(e.b, uint32(n))
	}
	e.b = append(e.b, s...)
}

func (e *encoder) arrayHeader(n int) { e.header(n, 0x90, 0xdc) }

func (e *encoder) mapHeader(n int) { e.header(n, 0x80, 0xde) }

func (e *encoder) header(n int, fix, c16 byte) {
	switch {
	case n <= 15:
		e.b = append(e.b, fix|byte(n))
	case n <= math.MaxUint16:
		e.b = append(e.b, c16)
		e.b = binary.BigEndian.AppendUint16(e.b, uint16(n))
	default:
		e.b = append(e.b, c16+1)
		e.b = binary.BigEndian.AppendUint32(e.b, uint32(n))
	}
}
