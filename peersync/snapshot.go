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
	// Version is the wire version Decode read it in (AppendEncode writes the current one).
	Version int
}

// Wire format: magic, version, then the body of that version, in uvarints and
// length-prefixed strings. Each version's body begins with the previous one's, so a
// reader takes what it knows from any version and skips the rest:
//
//	v1: origin, incarnation, seq, sent, loads
//	v2: v1's body, then placements (an endpoint table and the placements)
//	v3 and later: v2's body, then sections, each a tag (uvarint), a length (uvarint)
//	    and that many bytes; a reader skips the tags it does not know
//	v3: section 1, turnover: per load, in the loads' order, its Sent and its
//	    histories (a count, then Before, Cached and Blocks of each)
//
// New fields go in a new section (and a new version), never inside an older body, so
// a reader of this code shares the v2 part with any newer replica during a rolling
// upgrade. AppendEncode writes version 2 exactly when no load has turnover to share
// (readers older than sections, which refuse any other version and any trailing byte,
// accept it too), version 3 otherwise.
const (
	magic = 0x6b // 'k'
	// version is the newest AppendEncode writes, minVersion the oldest Decode reads.
	version    = 3
	minVersion = 1
	// tagTurnover is v3's section of the loads' turnover (Sent, Histories).
	tagTurnover = 1
	// maxHistories bounds the histories one load carries (placement keeps 64).
	maxHistories = 1 << 10
	// The max* bound what a decoder accepts (memory per message).
	maxEndpoints = 1 << 14
	maxActive    = 1 << 14
	maxPlaced    = 1 << 14
	maxSites     = 1 << 10
	maxString    = 512
)

// ErrMalformed is returned (wrapped, as a *MalformedError) for a message that is not a
// valid snapshot.
var ErrMalformed = errors.New("peersync: malformed snapshot")

// Reasons a snapshot is refused (MalformedError.Reason, the refused metric's label).
const (
	ReasonMagic     = "magic"     // not a snapshot: the first byte is not the magic
	ReasonVersion   = "version"   // a version older than minVersion (0)
	ReasonTruncated = "truncated" // ends inside a field or a section
	ReasonLimit     = "limit"     // a count, string or value beyond the decoder's bounds
	ReasonInvalid   = "invalid"   // fields that contradict each other, or no origin
	ReasonTrailing  = "trailing"  // bytes after the body of a version without sections
)

var reasons = []string{ReasonMagic, ReasonVersion, ReasonTruncated, ReasonLimit, ReasonInvalid, ReasonTrailing}

// MalformedError is a refused snapshot: the version it claims (0 when unread), why
// (one of the Reason constants) and the detail. errors.Is(err, ErrMalformed) holds.
type MalformedError struct {
	Version int
	Reason  string
	Detail  string
}

func (e *MalformedError) Error() string {
	return fmt.Sprintf("%v (version %d): %s: %s", ErrMalformed, e.Version, e.Reason, e.Detail)
}

// Is reports whether target is ErrMalformed.
func (e *MalformedError) Is(target error) bool { return target == ErrMalformed }

// AppendEncode appends s's encoding to dst.
func (s *Snapshot) AppendEncode(dst []byte) []byte {
	ver := 2
	if slices.ContainsFunc(s.Loads, func(l placement.EndpointLoad) bool { return l.Sent > 0 || len(l.Histories) > 0 }) {
		ver = 3
	}
	dst = append(dst, magic, byte(ver))
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
	if ver >= 3 {
		var sec []byte
		for _, l := range s.Loads {
			sec = binary.AppendUvarint(sec, uint64(max(l.Sent, 0)))
			sec = binary.AppendUvarint(sec, uint64(len(l.Histories)))
			for _, h := range l.Histories {
				for _, x := range [...]int{h.Before, h.Cached, h.Blocks} {
					sec = binary.AppendUvarint(sec, uint64(max(x, 0)))
				}
			}
		}
		dst = binary.AppendUvarint(dst, tagTurnover)
		dst = binary.AppendUvarint(dst, uint64(len(sec)))
		dst = append(dst, sec...)
	}
	return dst
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

// Decode parses a snapshot of any version from minVersion on (which it does not
// retain): of a newer version than it knows it keeps the v2 part and skips the
// sections. A message it refuses is a *MalformedError.
func Decode(b []byte) (Snapshot, error) {
	var s Snapshot
	if len(b) < 1 || b[0] != magic {
		return s, &MalformedError{Reason: ReasonMagic, Detail: "not a snapshot"}
	}
	if len(b) < 2 {
		return s, &MalformedError{Reason: ReasonTruncated, Detail: "no version"}
	}
	s.Version = int(b[1])
	if s.Version < minVersion {
		return Snapshot{}, &MalformedError{Version: s.Version, Reason: ReasonVersion,
			Detail: fmt.Sprintf("version %d, the oldest read is %d", s.Version, minVersion)}
	}
	d := decoder{b: b[2:]}
	s.Origin = d.str()
	s.Incarnation = d.uvarint()
	s.Seq = d.uvarint()
	s.Sent = time.Unix(0, d.varint())
	s.Loads = d.loads()
	if s.Version >= 2 {
		s.Placements = d.placements(s.Sent)
	}
	if s.Version >= 3 {
		d.sections(s.Loads)
	}
	if d.reason == "" && len(d.b) != 0 {
		d.fail(ReasonTrailing, "%d trailing bytes", len(d.b))
	}
	if d.reason == "" && s.Origin == "" {
		d.fail(ReasonInvalid, "empty origin")
	}
	if d.reason != "" {
		return Snapshot{}, &MalformedError{Version: s.Version, Reason: d.reason, Detail: d.detail}
	}
	return s, nil
}

func (d *decoder) loads() []placement.EndpointLoad {
	n := d.count(maxEndpoints, "endpoints")
	if d.reason != "" || n == 0 {
		return nil
	}
	loads := make([]placement.EndpointLoad, 0, min(n, len(d.b)/6+1))
	for i := 0; i < n && d.reason == ""; i++ {
		l := placement.EndpointLoad{Endpoint: d.str()}
		l.Requests, l.KVBlocks, l.Prefill, l.Misses = d.int(), d.int(), d.int(), d.int()
		k := d.count(maxActive, "active prefixes")
		if d.reason == "" && k > 0 {
			l.Active = make([]placement.ActivePrefix, 0, min(k, len(d.b)/9+1))
		}
		for j := 0; j < k && d.reason == ""; j++ {
			l.Active = append(l.Active, placement.ActivePrefix{Key: d.u64(), Blocks: d.int()})
		}
		loads = append(loads, l)
	}
	return loads
}

// placements reads v2's endpoint table and placements; decision times are relative to sent.
func (d *decoder) placements(sent time.Time) []placement.Placement {
	var eps []string
	n := d.count(maxEndpoints, "placement endpoints")
	for i := 0; i < n && d.reason == ""; i++ {
		eps = append(eps, d.str())
	}
	n = d.count(maxPlaced, "placements")
	if d.reason != "" || n == 0 {
		return nil
	}
	ps := make([]placement.Placement, 0, min(n, len(d.b)/12+1))
	for i := 0; i < n && d.reason == ""; i++ {
		p := placement.Placement{Key: d.u64(), Blocks: d.int(), Base: d.int()}
		p.Decided = time.Unix(0, sent.UnixNano()-d.varint())
		k := d.count(maxSites, "sites")
		if d.reason == "" && k > 0 {
			p.Sites = make([]placement.Site, 0, min(k, len(d.b)+1))
		}
		for j := 0; j < k && d.reason == ""; j++ {
			v := d.uvarint()
			if d.reason == "" && v>>1 >= uint64(len(eps)) {
				d.fail(ReasonInvalid, "site endpoint %d of %d", v>>1, len(eps))
			}
			if d.reason == "" {
				p.Sites = append(p.Sites, placement.Site{Endpoint: eps[v>>1], Home: v&1 == 1})
			}
		}
		ps = append(ps, p)
	}
	return ps
}

// sections reads v3's sections and later ones: a known tag is decoded from its own
// bytes (so fields a newer version appends to it are skipped), any other skipped whole.
func (d *decoder) sections(loads []placement.EndpointLoad) {
	for len(d.b) > 0 && d.reason == "" {
		tag := d.uvarint()
		n := d.uvarint()
		if d.reason == "" && n > uint64(len(d.b)) {
			d.fail(ReasonTruncated, "section of %d bytes, %d left", n, len(d.b))
		}
		if d.reason != "" {
			return
		}
		sec := &decoder{b: d.b[:n]}
		d.b = d.b[n:]
		if tag == tagTurnover {
			sec.turnover(loads)
			if sec.reason != "" {
				d.fail(sec.reason, "turnover: %s", sec.detail)
			}
		}
	}
}

// turnover reads the turnover section into loads: each one's Sent and histories.
func (d *decoder) turnover(loads []placement.EndpointLoad) {
	for i := 0; i < len(loads) && d.reason == ""; i++ {
		loads[i].Sent = d.total()
		k := d.count(maxHistories, "histories")
		if d.reason == "" && k > 0 {
			loads[i].Histories = make([]placement.History, 0, min(k, len(d.b)/3+1))
		}
		for j := 0; j < k && d.reason == ""; j++ {
			loads[i].Histories = append(loads[i].Histories, placement.History{Before: d.total(), Cached: d.int(), Blocks: d.int()})
		}
	}
}

// decoder reads fields from b; the first failure sticks (reason and detail) and every
// later read returns zero.
type decoder struct {
	b              []byte
	reason, detail string
}

func (d *decoder) fail(reason, format string, args ...any) {
	if d.reason == "" {
		d.reason, d.detail = reason, fmt.Sprintf(format, args...)
	}
}

func (d *decoder) uvarint() uint64 {
	if d.reason != "" {
		return 0
	}
	v, n := binary.Uvarint(d.b)
	if n == 0 {
		d.fail(ReasonTruncated, "truncated varint")
		return 0
	}
	if n < 0 {
		d.fail(ReasonLimit, "varint overflows 64 bits")
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) u64() uint64 {
	if d.reason != "" {
		return 0
	}
	if len(d.b) < 8 {
		d.fail(ReasonTruncated, "truncated key")
		return 0
	}
	v := binary.LittleEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *decoder) varint() int64 {
	if d.reason != "" {
		return 0
	}
	v, n := binary.Varint(d.b)
	if n == 0 {
		d.fail(ReasonTruncated, "truncated varint")
		return 0
	}
	if n < 0 {
		d.fail(ReasonLimit, "varint overflows 64 bits")
		return 0
	}
	d.b = d.b[n:]
	return v
}

// int reads a count, bounded so that sums over replicas cannot overflow.
func (d *decoder) int() int {
	v := d.uvarint()
	if v > 1<<31 {
		d.fail(ReasonLimit, "count %d out of range", v)
		return 0
	}
	return int(v)
}

// total reads a running total (a turnover's blocks since a router started), bounded
// so that sums over replicas cannot overflow.
func (d *decoder) total() int {
	v := d.uvarint()
	if v > 1<<52 {
		d.fail(ReasonLimit, "total %d out of range", v)
		return 0
	}
	return int(v)
}

// count reads the length of a list of what, at most limit.
func (d *decoder) count(limit int, what string) int {
	v := d.uvarint()
	if v > uint64(limit) {
		d.fail(ReasonLimit, "%d %s, at most %d", v, what, limit)
		return 0
	}
	return int(v)
}

func (d *decoder) str() string {
	n := d.uvarint()
	if d.reason != "" {
		return ""
	}
	if n > maxString {
		d.fail(ReasonLimit, "string of %d bytes, at most %d", n, maxString)
		return ""
	}
	if n > uint64(len(d.b)) {
		d.fail(ReasonTruncated, "string of %d bytes, %d left", n, len(d.b))
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}
