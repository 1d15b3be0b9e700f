package kvevents

import (
	"strconv"
)

// Reason says why a payload could not be decoded. Reasons are stable strings used as
// metric label values.
type Reason string

// Decode failure reasons.
const (
	// ReasonTruncated: the payload ends inside a value.
	ReasonTruncated Reason = "truncated"
	// ReasonBadType: a value has a msgpack type the field does not allow, or an integer
	// out of the field's range.
	ReasonBadType Reason = "bad_type"
	// ReasonBadHashSize: a binary block hash is neither 16 nor 32 bytes long.
	ReasonBadHashSize Reason = "bad_hash_size"
	// ReasonBadShape: a batch or event array has too few elements.
	ReasonBadShape Reason = "bad_shape"
	// ReasonMissingField: a map-encoded batch or event lacks a required field.
	ReasonMissingField Reason = "missing_field"
	// ReasonTooDeep: nesting deeper than the decoder accepts (in an ignored value).
	ReasonTooDeep Reason = "too_deep"
	// ReasonTrailingBytes: bytes follow the batch.
	ReasonTrailingBytes Reason = "trailing_bytes"
	// ReasonInvalidMsgpack: a byte that starts no msgpack value (0xc1).
	ReasonInvalidMsgpack Reason = "invalid_msgpack"
)

// Reasons lists every Reason, for pre-creating metric series.
var Reasons = []Reason{ReasonTruncated, ReasonBadType, ReasonBadHashSize, ReasonBadShape,
	ReasonMissingField, ReasonTooDeep, ReasonTrailingBytes, ReasonInvalidMsgpack}

// DecodeError reports a payload that is not a vLLM event batch. Callers branch on Reason.
type DecodeError struct {
	Reason Reason
	// Offset is the byte offset in the payload where decoding failed.
	Offset int
}

func (e *DecodeError) Error() string {
	return "kvevents: decode: " + string(e.Reason) + " at offset " + strconv.Itoa(e.Offset)
}

// maxDepth bounds the nesting of values the decoder skips (unknown fields, extra_keys).
const maxDepth = 64

// Decode parses one vLLM event batch payload into into, replacing its contents.
//
// Accepted shapes: the batch as an array [ts, events] or [ts, events, dp_rank|nil] or as
// a map {ts, events, data_parallel_rank}; each event as a positional array whose first
// element is the tag ("BlockStored", "BlockRemoved", "AllBlocksCleared"), of any length
// from the oldest to the newest vLLM, or as a map whose "type" key holds the tag. Unknown
// event types, unknown map keys and extra trailing array elements are ignored. Block
// hashes may be signed or unsigned integers of any width (stored as their 64-bit two's
// complement) or 16- or 32-byte binaries (reduced to their last 8 bytes, big-endian). A
// parent hash that is nil or the integer 0 (sent by simulators for "no parent") means no
// parent.
//
// Decode reuses the event structs and slices of earlier decodes into the same Batch, so a
// caller that keeps events beyond the next Decode into that Batch must copy them (or
// decode into a fresh Batch).
// Strings and ExtraKeys never alias payload. On error, into holds a partial batch and the
// error is a *DecodeError; Decode never panics.
func Decode(payload []byte, into *Batch) error {
	d := decoder{b: payload}
	if err := d.batch(into); err != nil {
		return err
	}
	if d.off != len(d.b) {
		return &DecodeError{Reason: ReasonTrailingBytes, Offset: d.off}
	}
	return nil
}
func (d *decoder) batch(into *Batch) error {
	into.TS, into.DPRank, into.HasDPRank = 0, 0, false
	into.Events = into.Events[:0]
	if into.scratch == nil {
		into.scratch = &decodeScratch{}
	}
	into.scratch.ns, into.scratch.nr = 0, 0
	n, ok, err := d.arrayLen()
	if err != nil {
		return err
	}
	if ok {
		if n < 2 {
			return d.fail(ReasonBadShape)
		}
		if into.TS, err = d.float(); err != nil {
			return err
		}
		if err := d.events(into); err != nil {
			return err
		}
		if n >= 3 {
			if err := d.dpRank(into); err != nil {
				return err
			}
		}
		for i := 3; i < n; i++ {
			if err := d.skip(0); err != nil {
				return err
			}
		}
		return nil
	}
	n, ok, err = d.mapLen()
	if err != nil {
		return err
	}
	if !ok {
		return d.fail(ReasonBadType)
	}
	var seenTS, seenEvents bool
	for range n {
		k, err := d.str()
		if err != nil {
			return err
		}
		switch string(k) {
		case "ts":
			seenTS = true
			if into.TS, err = d.float(); err != nil {
				return err
			}
		case "events":
			seenEvents = true
			if err := d.events(into); err != nil {
				return err
			}
		case "data_parallel_rank":
			if err := d.dpRank(into); err != nil {
				return err
			}
		default:
			if err := d.skip(0); err != nil {
				return err
			}
		}
	}
	if !seenTS || !seenEvents {
		return d.fail(ReasonMissingField)
	}
	return nil
}

func (d *decoder) dpRank(into *Batch) error {
	r, ok, err := d.optSmallInt()
	if err != nil {
		return err
	}
	into.DPRank, into.HasDPRank = r, ok
	return nil
}

func (d *decoder) events(into *Batch) error {
	n, err := d.listLen()
	if err != nil {
		return err
	}
	for range n {
		if err := d.event(into); err != nil {
			return err
		}
	}
	return nil
}

// Field identifiers shared by both encodings. Positional arrays map element i to
// storedFields[i] or removedFields[i].
type field uint8

const (
	fUnknown field = iota
	fType
	fHashes
	fParent
	fTokens
	fBlockSize
	fLoRAID
	fMedium
	fLoRAName
	fExtraKeys
	fGroupIdx
	fSpecKind
	fSlidingWindow
	numFields
)

var storedFields = [...]field{fType, fHashes, fParent, fTokens, fBlockSize, fLoRAID,
	fMedium, fLoRAName, fExtraKeys, fGroupIdx, fSpecKind, fSlidingWindow}

var removedFields = [...]field{fType, fHashes, fMedium, fGroupIdx}

func fieldByName(k []byte) field {
	switch string(k) {
	case "type":
		return fType
	case "block_hashes":
		return fHashes
	case "parent_block_hash":
		return fParent
	case "token_ids":
		return fTokens
	case "block_size":
		return fBlockSize
	case "lora_id":
		return fLoRAID
	case "medium":
		return fMedium
	case "lora_name":
		return fLoRAName
	case "extra_keys":
		return fExtraKeys
	case "group_idx":
		return fGroupIdx
	case "kv_cache_spec_kind":
		return fSpecKind
	case "kv_cache_spec_sliding_window":
		return fSlidingWindow
	}
	return fUnknown
}

type kind uint8

const (
	kindUnknown kind = iota
	kindStored
	kindRemoved
	kindCleared
)

func kindOf(tag []byte) kind {
	switch string(tag) {
	case "BlockStored":
		return kindStored
	case "BlockRemoved":
		return kindRemoved
	case "AllBlocksCleared":
		return kindCleared
	}
	return kindUnknown
}

// decodeScratch holds the event structs of earlier decodes into a Batch.
type decodeScratch struct {
	stored  []*BlockStored
	removed []*BlockRemoved
	// ns and nr count the structs of each type used by the current decode.
	ns, nr int
}

// slot returns the next reusable event struct of the wanted kind, reset, and appends it.
func (d *decoder) slot(into *Batch, k kind) Event {
	sc := into.scratch
	var ev Event
	switch k {
	case kindStored:
		var p *BlockStored
		if sc.ns < len(sc.stored) {
			p = sc.stored[sc.ns]
			*p = BlockStored{BlockHashes: p.BlockHashes[:0], TokenIDs: p.TokenIDs[:0],
				ExtraKeys: p.ExtraKeys[:0]}
		} else {
			p = &BlockStored{}
			sc.stored = append(sc.stored, p)
		}
		sc.ns++
		ev = p
	case kindRemoved:
		var p *BlockRemoved
		if sc.nr < len(sc.removed) {
			p = sc.removed[sc.nr]
			*p = BlockRemoved{BlockHashes: p.BlockHashes[:0]}
		} else {
			p = &BlockRemoved{}
			sc.removed = append(sc.removed, p)
		}
		sc.nr++
		ev = p
	case kindCleared:
		ev = clearedEvent
	}
	into.Events = append(into.Events, ev)
	return ev
}

// clearedEvent is shared: AllBlocksCleared has no fields.
var clearedEvent = &AllBlocksCleared{}

func (d *decoder) event(into *Batch) error {
	n, ok, err := d.arrayLen()
	if err != nil {
		return err
	}
	if ok {
		return d.arrayEvent(into, n)
	}
	n, ok, err = d.mapLen()
	if err != nil {
		return err
	}
	if !ok {
		return d.fail(ReasonBadType)
	}
	return d.mapEvent(into, n)
}

func (d *decoder) arrayEvent(into *Batch, n int) error {
	if n < 1 {
		return d.fail(ReasonBadShape)
	}
	tag, err := d.str()
	if err != nil {
		return err
	}
	k := kindOf(tag)
	var fields []field
	var required int // elements needed after the tag
	switch k {
	case kindStored:
		fields, required = storedFields[:], 4 // hashes, parent, tokens, block_size
	case kindRemoved:
		fields, required = removedFields[:], 1
	}
	if n-1 < required {
		return d.fail(ReasonBadShape)
	}
	var ev Event
	if k != kindUnknown {
		ev = d.slot(into, k)
	}
	for i := 1; i < n; i++ {
		f := fUnknown
		if i < len(fields) {
			f = fields[i]
		}
		if err := d.field(ev, f); err != nil {
			return err
		}
	}
	if s, ok := ev.(*BlockStored); ok {
		normaliseStored(s)
	}
	return nil
}

func (d *decoder) mapEvent(into *Batch, n int) error {
	start := d.off
	// msgspec writes the tag first; find it without decoding anything else otherwise.
	k := kindUnknown
	found := false
	for i := 0; i < n; i++ {
		key, err := d.str()
		if err != nil {
			return err
		}
		if fieldByName(key) == fType {
			tag, err := d.str()
			if err != nil {
				return err
			}
			k, found = kindOf(tag), true
			break
		}
		if err := d.skip(0); err != nil {
			return err
		}
	}
	if !found {
		return d.fail(ReasonMissingField)
	}
	d.off = start
	var ev Event
	if k != kindUnknown {
		ev = d.slot(into, k)
	}
	var seen [numFields]bool
	for range n {
		key, err := d.str()
		if err != nil {
			return err
		}
		f := fieldByName(key)
		if ev == nil || f == fType {
			f = fUnknown
		}
		seen[f] = true
		if err := d.field(ev, f); err != nil {
			return err
		}
	}
	switch ev := ev.(type) {
	case *BlockStored:
		if !seen[fHashes] || !seen[fTokens] || !seen[fBlockSize] {
			return d.fail(ReasonMissingField)
		}
		normaliseStored(ev)
	case *BlockRemoved:
		if !seen[fHashes] {
			return d.fail(ReasonMissingField)
		}
	}
	return nil
}

// normaliseStored finishes a BlockStored: empty slices for nil ExtraKeys.
func normaliseStored(s *BlockStored) {
	if len(s.ExtraKeys) == 0 {
		s.ExtraKeys = s.ExtraKeys[:0]
	}
}

// field decodes one field value into ev (nil ev or fUnknown: skip it).
func (d *decoder) field(ev Event, f field) error {
	var err error
	switch ev := ev.(type) {
	case *BlockStored:
		switch f {
		case fHashes:
			ev.BlockHashes, err = d.hashes(ev.BlockHashes)
		case fParent:
			if d.nextNil() {
				ev.ParentHash, ev.HasParent = 0, false
				return nil
			}
			ev.ParentHash, err = d.hash()
			ev.HasParent = ev.ParentHash != 0
		case fTokens:
			ev.TokenIDs, err = d.tokens(ev.TokenIDs)
		case fBlockSize:
			ev.BlockSize, err = d.smallInt()
		case fLoRAID:
			if d.nextNil() {
				ev.LoRAID, ev.HasLoRAID = 0, false
				return nil
			}
			ev.LoRAID, err = d.int64()
			ev.HasLoRAID = err == nil
		case fMedium:
			ev.Medium, err = d.optStr()
		case fLoRAName:
			ev.LoRAName, err = d.optStr()
		case fExtraKeys:
			if d.nextNil() {
				ev.ExtraKeys = ev.ExtraKeys[:0]
				return nil
			}
			start := d.off
			if err = d.skip(1); err == nil {
				ev.ExtraKeys = append(ev.ExtraKeys[:0], d.b[start:d.off]...)
			}
		case fGroupIdx:
			ev.GroupIdx, ev.HasGroupIdx, err = d.optSmallInt()
		case fSpecKind:
			ev.KVCacheSpecKind, err = d.optStr()
		case fSlidingWindow:
			ev.KVCacheSpecSlidingWindow, ev.HasSlidingWindow, err = d.optSmallInt()
		default:
			err = d.skip(0)
		}
	case *BlockRemoved:
		switch f {
		case fHashes:
			ev.BlockHashes, err = d.hashes(ev.BlockHashes)
		case fMedium:
			ev.Medium, err = d.optStr()
		case fGroupIdx:
			ev.GroupIdx, ev.HasGroupIdx, err = d.optSmallInt()
		default:
			err = d.skip(0)
		}
	default:
		err = d.skip(0)
	}
	return err
}
