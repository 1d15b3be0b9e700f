package kvevents

import (
	"encoding/binary"
	"math"
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

type decoder struct {
	b   []byte
	off int
}

func (d *decoder) fail(r Reason) error { return &DecodeError{Reason: r, Offset: d.off} }

func (d *decoder) need(n int) bool { return n >= 0 && len(d.b)-d.off >= n }

func (d *decoder) peek() (byte, error) {
	if d.off >= len(d.b) {
		return 0, d.fail(ReasonTruncated)
	}
	return d.b[d.off], nil
}

// nextNil consumes a nil and reports true if the next value is nil.
func (d *decoder) nextNil() bool {
	if d.off < len(d.b) && d.b[d.off] == 0xc0 {
		d.off++
		return true
	}
	return false
}

func (d *decoder) be(n int) (uint64, error) {
	if !d.need(n) {
		return 0, d.fail(ReasonTruncated)
	}
	var v uint64
	for _, c := range d.b[d.off : d.off+n] {
		v = v<<8 | uint64(c)
	}
	d.off += n
	return v, nil
}

// length reads a container header of the given family. fix is the fixed-size prefix
// (0x90 arrays, 0x80 maps), c16 the 16-bit form's tag (c16+1 the 32-bit one). The length is
// checked against the bytes left (every element takes at least one byte per slot).
func (d *decoder) length(fix, c16 byte, slots int) (int, bool, error) {
	c, err := d.peek()
	if err != nil {
		return 0, false, err
	}
	var n uint64
	switch {
	case c&0xf0 == fix:
		d.off++
		n = uint64(c & 0x0f)
	case c == c16:
		d.off++
		if n, err = d.be(2); err != nil {
			return 0, true, err
		}
	case c == c16+1:
		d.off++
		if n, err = d.be(4); err != nil {
			return 0, true, err
		}
	default:
		return 0, false, nil
	}
	if n*uint64(slots) > uint64(len(d.b)-d.off) {
		return 0, true, d.fail(ReasonTruncated)
	}
	return int(n), true, nil
}

// arrayLen reads an array header; ok is false (nothing consumed) if the value is not an
// array.
func (d *decoder) arrayLen() (n int, ok bool, err error) { return d.length(0x90, 0xdc, 1) }

// mapLen reads a map header; ok is false (nothing consumed) if the value is not a map.
func (d *decoder) mapLen() (n int, ok bool, err error) { return d.length(0x80, 0xde, 2) }

// integer reads any msgpack integer. neg reports a negative value, in which case u holds
// its 64-bit two's complement.
func (d *decoder) integer() (u uint64, neg bool, err error) {
	c, err := d.peek()
	if err != nil {
		return 0, false, err
	}
	switch {
	case c <= 0x7f:
		d.off++
		return uint64(c), false, nil
	case c >= 0xe0:
		d.off++
		return uint64(int64(int8(c))), true, nil
	}
	switch c {
	case 0xcc, 0xcd, 0xce, 0xcf:
		d.off++
		u, err = d.be(1 << (c - 0xcc))
		return u, false, err
	case 0xd0, 0xd1, 0xd2, 0xd3:
		d.off++
		n := 1 << (c - 0xd0)
		if u, err = d.be(n); err != nil {
			return 0, false, err
		}
		shift := uint(64 - 8*n)
		s := int64(u<<shift) >> shift
		return uint64(s), s < 0, nil
	}
	return 0, false, d.fail(ReasonBadType)
}

// int64 reads an integer that must fit in int64.
func (d *decoder) int64() (int64, error) {
	start := d.off
	u, neg, err := d.integer()
	if err != nil {
		return 0, err
	}
	if !neg && u > math.MaxInt64 {
		d.off = start
		return 0, d.fail(ReasonBadType)
	}
	return int64(u), nil
}

// smallInt reads an integer that must fit in 32 bits (sizes, ranks, indices).
func (d *decoder) smallInt() (int, error) {
	start := d.off
	v, err := d.int64()
	if err != nil {
		return 0, err
	}
	if v < math.MinInt32 || v > math.MaxInt32 {
		d.off = start
		return 0, d.fail(ReasonBadType)
	}
	return int(v), nil
}

// optSmallInt reads a smallInt or nil; ok is false for nil (and on error).
func (d *decoder) optSmallInt() (v int, ok bool, err error) {
	if d.nextNil() {
		return 0, false, nil
	}
	v, err = d.smallInt()
	return v, err == nil, err
}

func (d *decoder) float() (float64, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	switch c {
	case 0xcb:
		d.off++
		u, err := d.be(8)
		return math.Float64frombits(u), err
	case 0xca:
		d.off++
		u, err := d.be(4)
		return float64(math.Float32frombits(uint32(u))), err
	}
	v, err := d.int64()
	return float64(v), err
}

// str reads a msgpack str; the result aliases the payload.
func (d *decoder) str() ([]byte, error) {
	c, err := d.peek()
	if err != nil {
		return nil, err
	}
	var n uint64
	switch {
	case c&0xe0 == 0xa0:
		d.off++
		n = uint64(c & 0x1f)
	case c == 0xd9 || c == 0xda || c == 0xdb:
		d.off++
		if n, err = d.be(1 << (c - 0xd9)); err != nil {
			return nil, err
		}
	default:
		return nil, d.fail(ReasonBadType)
	}
	if n > uint64(len(d.b)-d.off) {
		return nil, d.fail(ReasonTruncated)
	}
	s := d.b[d.off : d.off+int(n)]
	d.off += int(n)
	return s, nil
}

// optStr reads a str or nil; common values are interned, to avoid allocating.
func (d *decoder) optStr() (string, error) {
	if d.nextNil() {
		return "", nil
	}
	s, err := d.str()
	if err != nil {
		return "", err
	}
	return intern(s), nil
}

func intern(b []byte) string {
	switch string(b) {
	case "GPU":
		return "GPU"
	case "CPU":
		return "CPU"
	case "full_attention":
		return "full_attention"
	case "sliding_window":
		return "sliding_window"
	}
	return string(b)
}

// hash reads one block hash: an integer of any width or a 16- or 32-byte binary.
func (d *decoder) hash() (uint64, error) {
	c, err := d.peek()
	if err != nil {
		return 0, err
	}
	if c >= 0xc4 && c <= 0xc6 {
		d.off++
		n, err := d.be(1 << (c - 0xc4))
		if err != nil {
			return 0, err
		}
		if n > uint64(len(d.b)-d.off) {
			return 0, d.fail(ReasonTruncated)
		}
		if n != 16 && n != 32 {
			return 0, d.fail(ReasonBadHashSize)
		}
		end := d.off + int(n)
		h := binary.BigEndian.Uint64(d.b[end-8 : end])
		d.off = end
		return h, nil
	}
	u, _, err := d.integer()
	return u, err
}

// numbers reads the header of an array of numbers (block hashes, token ids) and
// returns dst resized to its length, reusing dst's storage when it is large enough so
// that a reused Batch decodes without allocating. The caller decodes the elements.
func numbers[T uint32 | uint64](d *decoder, dst []T) ([]T, error) {
	n, err := d.listLen()
	if err != nil {
		return dst, err
	}
	if cap(dst) < n {
		dst = make([]T, n)
	}
	return dst[:n], nil
}

// listLen reads the header of an array the format requires; any other value is
// ReasonBadType.
func (d *decoder) listLen() (int, error) {
	n, ok, err := d.arrayLen()
	if err == nil && !ok {
		err = d.fail(ReasonBadType)
	}
	return n, err
}

func (d *decoder) hashes(dst []uint64) ([]uint64, error) {
	dst, err := numbers(d, dst)
	if err != nil {
		return dst, err
	}
	for i := range dst {
		// Fast path: vLLM's default hashes are uint64s.
		if off := d.off; off+8 < len(d.b) && d.b[off] == 0xcf {
			dst[i] = binary.BigEndian.Uint64(d.b[off+1 : off+9])
			d.off += 9
			continue
		}
		h, err := d.hash()
		if err != nil {
			return dst[:i], err
		}
		dst[i] = h
	}
	return dst, nil
}

func (d *decoder) tokens(dst []uint32) ([]uint32, error) {
	dst, err := numbers(d, dst)
	if err != nil {
		return dst, err
	}
	b, off := d.b, d.off
	for i := range dst {
		if off >= len(b) {
			d.off = off
			return dst[:i], d.fail(ReasonTruncated)
		}
		// Fast paths for the widths token ids take in practice.
		switch c := b[off]; {
		case c <= 0x7f:
			dst[i] = uint32(c)
			off++
			continue
		case c == 0xcc && off+1 < len(b):
			dst[i] = uint32(b[off+1])
			off += 2
			continue
		case c == 0xcd && off+2 < len(b):
			dst[i] = uint32(b[off+1])<<8 | uint32(b[off+2])
			off += 3
			continue
		case c == 0xce && off+4 < len(b):
			dst[i] = binary.BigEndian.Uint32(b[off+1 : off+5])
			off += 5
			continue
		}
		d.off = off
		u, neg, err := d.integer()
		if err != nil {
			return dst[:i], err
		}
		if neg || u > math.MaxUint32 {
			d.off = off
			return dst[:i], d.fail(ReasonBadType)
		}
		dst[i] = uint32(u)
		off = d.off
	}
	d.off = off
	return dst, nil
}

// skip consumes one value of any type.
func (d *decoder) skip(depth int) error {
	if depth > maxDepth {
		return d.fail(ReasonTooDeep)
	}
	c, err := d.peek()
	if err != nil {
		return err
	}
	var n uint64 // bytes of payload to skip after the header
	switch {
	case c <= 0x7f || c >= 0xe0 || c == 0xc0 || c == 0xc2 || c == 0xc3:
		d.off++
		return nil
	case c&0xe0 == 0xa0:
		d.off++
		n = uint64(c & 0x1f)
	case c&0xf0 == 0x90 || c == 0xdc || c == 0xdd:
		l, _, err := d.arrayLen()
		if err != nil {
			return err
		}
		for range l {
			if err := d.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case c&0xf0 == 0x80 || c == 0xde || c == 0xdf:
		l, _, err := d.mapLen()
		if err != nil {
			return err
		}
		for range 2 * l {
			if err := d.skip(depth + 1); err != nil {
				return err
			}
		}
		return nil
	case c == 0xc1:
		return d.fail(ReasonInvalidMsgpack)
	case c == 0xc4 || c == 0xc5 || c == 0xc6: // bin
		d.off++
		if n, err = d.be(1 << (c - 0xc4)); err != nil {
			return err
		}
	case c == 0xd9 || c == 0xda || c == 0xdb: // str
		d.off++
		if n, err = d.be(1 << (c - 0xd9)); err != nil {
			return err
		}
	case c == 0xc7 || c == 0xc8 || c == 0xc9: // ext
		d.off++
		if n, err = d.be(1 << (c - 0xc7)); err != nil {
			return err
		}
		n++ // type byte
	case c == 0xca:
		d.off++
		n = 4
	case c == 0xcb:
		d.off++
		n = 8
	case c >= 0xcc && c <= 0xcf:
		d.off++
		n = 1 << (c - 0xcc)
	case c >= 0xd0 && c <= 0xd3:
		d.off++
		n = 1 << (c - 0xd0)
	case c >= 0xd4 && c <= 0xd8: // fixext
		d.off++
		n = 1 + 1<<(c-0xd4)
	}
	if n > uint64(len(d.b)-d.off) {
		return d.fail(ReasonTruncated)
	}
	d.off += int(n)
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
