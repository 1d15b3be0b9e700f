package kvevents

import (
	"encoding/binary"
	"math"
)

// decoder reads msgpack values from b at off: the format's primitives, independent of
// vLLM's schema (decode.go), which is written on top of them.
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
