package peersync

import (
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvrouter/kvrouter/placement"
)

// Snapshot is one replica's whole shared state at one moment: its in-flight load per
// endpoint. State travels as snapshots, not deltas: each replica publishes only what it
// observed itself (a per-origin gauge), so a snapshot replaces its origin's previous
// one, a lost or reordered message costs nothing but freshness, and no merge needs an
// order between replicas.
type Snapshot struct {
	// Origin names the replica that observed the state (its memberlist node name).
	Origin string
	// Incarnation grows each time the replica starts (its start time), Seq with each
	// snapshot it publishes: (Incarnation, Seq) orders one origin's snapshots.
	Incarnation uint64
	Seq         uint64
	// Sent is when the origin built it (its clock), for the view's lag.
	Sent time.Time
	// Loads are its in-flight requests per endpoint (endpoints with none are absent).
	Loads []placement.EndpointLoad
	// Placements are the origin's placement decisions: those made since its last
	// snapshot, or (every expiry/4, and on join) all of them. Unlike loads they merge
	// into the receiver's table, the latest decision per prefix winning.
	Placements []placement.Placement
}

// Wire format, version 2 (1 had no placements): magic, version, then uvarints and
// length-prefixed strings.
const (
	magic   = 0x6b // 'k'
	version = 2
	// maxEndpoints and maxString bound what a decoder accepts (memory per message).
	maxEndpoints = 1 << 14
	maxActive    = 1 << 14
	maxPlaced    = 1 << 14
	maxSites     = 1 << 10
	maxString    = 512
)

// ErrMalformed is returned (wrapped) for a message that is not a valid snapshot.
var ErrMalformed = errors.New("peersync: malformed snapshot")

// AppendEncode appends s's encoding to dst.
func (s *Snapshot) AppendEncode(dst []byte) []byte {
	dst = append(dst, magic, version)
	dst = appendString(dst, s.Origin)
	dst = binary.AppendUvarint(dst, s.Incarnation)
	dst = binary.AppendUvarint(dst, s.Seq)
	dst = binary.AppendVarint(dst, s.Sent.UnixNano())
	dst = binary.AppendUvarint(dst, uint64(len(s.Loads)))
	for _, l := range s.Loads {
		dst = appendString(dst, l.Endpoint)
		for _, v := range [...]int{l.Requests, l.KVBlocks, l.Prefill, l.Misses} {
			dst = binary.AppendUvarint(dst, uint64(max(v, 0)))
		}
		dst = binary.AppendUvarint(dst, uint64(len(l.Active)))
		for _, a := range l.Active {
			dst = binary.LittleEndian.AppendUint64(dst, a.Key)
			dst = binary.AppendUvarint(dst, uint64(max(a.Blocks, 0)))
		}
	}
	// Placements name their endpoints by index into a table of the endpoints they use,
	// each site one uvarint (index << 1 | home); decision times are relative to Sent.
	var eps []string
	for _, p := range s.Placements {
		for _, st := range p.Sites {
			if !slices.Contains(eps, st.Endpoint) {
				eps = append(eps, st.Endpoint)
			}
		}
	}
	dst = binary.AppendUvarint(dst, uint64(len(eps)))
	for _, e := range eps {
		dst = appendString(dst, e)
	}
	dst = binary.AppendUvarint(dst, uint64(len(s.Placements)))
	for _, p := range s.Placements {
		dst = binary.LittleEndian.AppendUint64(dst, p.Key)
		dst = binary.AppendUvarint(dst, uint64(max(p.Blocks, 0)))
		dst = binary.AppendUvarint(dst, uint64(max(p.Base, 0)))
		dst = binary.AppendVarint(dst, s.Sent.UnixNano()-p.Decided.UnixNano())
		dst = binary.AppendUvarint(dst, uint64(len(p.Sites)))
		for _, st := range p.Sites {
			v := uint64(slices.Index(eps, st.Endpoint)) << 1
			if st.Home {
				v |= 1
			}
			dst = binary.AppendUvarint(dst, v)
		}
	}
	return dst
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// Decode parses a snapshot from b (which it does not retain).
func Decode(b []byte) (Snapshot, error) {
	d := decoder{b: b}
	var s Snapshot
	if len(b) < 2 || b[0] != magic {
		return s, fmt.Errorf("%w: bad magic", ErrMalformed)
	}
	if b[1] != version {
		return s, fmt.Errorf("%w: version %d, want %d", ErrMalformed, b[1], version)
	}
	d.b = b[2:]
	s.Origin = d.str()
	s.Incarnation = d.uvarint()
	s.Seq = d.uvarint()
	s.Sent = time.Unix(0, d.varint())
	n := d.uvarint()
	if n > maxEndpoints {
		return Snapshot{}, fmt.Errorf("%w: %d endpoints, at most %d", ErrMalformed, n, maxEndpoints)
	}
	if d.err == nil && n > 0 {
		s.Loads = make([]placement.EndpointLoad, 0, min(n, uint64(len(d.b)/6+1)))
	}
	for i := uint64(0); i < n && d.err == nil; i++ {
		l := placement.EndpointLoad{Endpoint: d.str()}
		l.Requests, l.KVBlocks, l.Prefill, l.Misses = d.int(), d.int(), d.int(), d.int()
		k := d.uvarint()
		if k > maxActive {
			d.err = fmt.Errorf("%d active prefixes, at most %d", k, maxActive)
		}
		if d.err == nil && k > 0 {
			l.Active = make([]placement.ActivePrefix, 0, min(k, uint64(len(d.b)/9+1)))
		}
		for j := uint64(0); j < k && d.err == nil; j++ {
			l.Active = append(l.Active, placement.ActivePrefix{Key: d.u64(), Blocks: d.int()})
		}
		s.Loads = append(s.Loads, l)
	}
	var eps []string
	if n := d.uvarint(); n > maxEndpoints {
		d.err = fmt.Errorf("%d placement endpoints, at most %d", n, maxEndpoints)
	} else {
		for i := uint64(0); i < n && d.err == nil; i++ {
			eps = append(eps, d.str())
		}
	}
	if n := d.uvarint(); n > maxPlaced {
		d.err = fmt.Errorf("%d placements, at most %d", n, maxPlaced)
	} else if d.err == nil && n > 0 {
		s.Placements = make([]placement.Placement, 0, min(n, uint64(len(d.b)/12+1)))
		for i := uint64(0); i < n && d.err == nil; i++ {
			p := placement.Placement{Key: d.u64(), Blocks: d.int(), Base: d.int()}
			p.Decided = time.Unix(0, s.Sent.UnixNano()-d.varint())
			k := d.uvarint()
			if k > maxSites {
				d.err = fmt.Errorf("%d sites, at most %d", k, maxSites)
			}
			if d.err == nil && k > 0 {
				p.Sites = make([]placement.Site, 0, min(k, uint64(len(d.b)+1)))
			}
			for j := uint64(0); j < k && d.err == nil; j++ {
				v := d.uvarint()
				if d.err == nil && v>>1 >= uint64(len(eps)) {
					d.err = fmt.Errorf("site endpoint %d of %d", v>>1, len(eps))
				}
				if d.err == nil {
					p.Sites = append(p.Sites, placement.Site{Endpoint: eps[v>>1], Home: v&1 == 1})
				}
			}
			s.Placements = append(s.Placements, p)
		}
	}
	if d.err == nil && len(d.b) != 0 {
		d.err = fmt.Errorf("%d trailing bytes", len(d.b))
	}
	if d.err != nil {
		return Snapshot{}, fmt.Errorf("%w: %v", ErrMalformed, d.err)
	}
	if s.Origin == "" {
		return Snapshot{}, fmt.Errorf("%w: empty origin", ErrMalformed)
	}
	return s, nil
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) uvarint() uint64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.err = errors.New("truncated varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) u64() uint64 {
	if d.err != nil {
		return 0
	}
	if len(d.b) < 8 {
		d.err = errors.New("truncated key")
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *decoder) varint() int64 {
	if d.err != nil {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.err = errors.New("truncated varint")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// int reads a count, bounded so that sums over replicas cannot overflow.
func (d *decoder) int() int {
	v := d.uvarint()
	if v > 1<<31 {
		if d.err == nil {
			d.err = fmt.Errorf("count %d out of range", v)
		}
		return 0
	}
	return int(v)
}

func (d *decoder) str() string {
	n := d.uvarint()
	if d.err != nil {
		return ""
	}
	if n > maxString || n > uint64(len(d.b)) {
		d.err = fmt.Errorf("string of %d bytes (%d left, at most %d)", n, len(d.b), maxString)
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}
