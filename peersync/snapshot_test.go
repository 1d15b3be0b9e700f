package peersync

import (
	"encoding/binary"
	"encoding/hex"
	"errors"
	"flag"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/placement"
)

var update = flag.Bool("update", false, "rewrite testdata/*.golden")

// sample is a snapshot with every kind of field: loads with and without active
// prefixes, placements with and without sites.
func sample() Snapshot {
	return Snapshot{Origin: "a", Incarnation: 7, Seq: 3, Sent: time.Unix(5, 6), Loads: []placement.EndpointLoad{
		{Endpoint: "10.0.0.1:8000", Load: placement.Load{Requests: 2, KVBlocks: 40, Prefill: 900, Misses: 1},
			Active: []placement.ActivePrefix{{Key: 1 << 63, Blocks: 9}, {Key: 5, Blocks: 1}}},
		{Endpoint: "10.0.0.2:8000", Load: placement.Load{Requests: 1}},
	}, Placements: []placement.Placement{
		{Key: 9, Blocks: 127, Decided: time.Unix(4, 2), Sites: []placement.Site{
			{Endpoint: "10.0.0.3:8000", Home: true}, {Endpoint: "10.0.0.1:8000"}}},
		{Key: 1 << 62, Blocks: 30, Base: 127, Decided: time.Unix(5, 6)},
		{Key: 11, Blocks: 3, Decided: time.Unix(3, 0), Sites: []placement.Site{{Endpoint: "10.0.0.1:8000", Home: true}}},
	}}
}

// withTurnover is sample with the loads' cache turnover (Sent, Histories), which
// version 3 adds.
func withTurnover() Snapshot {
	s := sample()
	s.Loads = slices.Clone(s.Loads)
	s.Loads[0].Sent = 5000
	s.Loads[0].Histories = []placement.History{{Before: 1200, Cached: 2, Blocks: 2100}, {Before: 4000, Blocks: 900}}
	s.Loads[1].Sent = 1 << 40
	return s
}

// sameSnapshot fails t unless got carries want's fields (Version aside).
func sameSnapshot(t *testing.T, got, want Snapshot) {
	t.Helper()
	if got.Origin != want.Origin || got.Incarnation != want.Incarnation || got.Seq != want.Seq || !got.Sent.Equal(want.Sent) ||
		len(got.Loads) != len(want.Loads) || len(got.Placements) != len(want.Placements) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
	for i, w := range want.Loads {
		g := got.Loads[i]
		if g.Endpoint != w.Endpoint || g.Load != w.Load || !slices.Equal(g.Active, w.Active) ||
			g.Sent != w.Sent || !slices.Equal(g.Histories, w.Histories) {
			t.Fatalf("load %d: got %+v, want %+v", i, g, w)
		}
	}
	for i, w := range want.Placements {
		g := got.Placements[i]
		if g.Key != w.Key || g.Blocks != w.Blocks || g.Base != w.Base || !g.Decided.Equal(w.Decided) ||
			!slices.Equal(g.Sites, w.Sites) {
			t.Fatalf("placement %d: got %+v, want %+v", i, g, w)
		}
	}
}

// appendV1 writes s in version 1's layout, as replicas before placements were shared
// wrote it: magic, 1, origin, incarnation, seq, sent, loads; nothing after.
func appendV1(dst []byte, s *Snapshot) []byte {
	str := func(dst []byte, v string) []byte { return append(binary.AppendUvarint(dst, uint64(len(v))), v...) }
	dst = append(dst, magic, 1)
	dst = str(dst, s.Origin)
	dst = binary.AppendUvarint(dst, s.Incarnation)
	dst = binary.AppendUvarint(dst, s.Seq)
	dst = binary.AppendVarint(dst, s.Sent.UnixNano())
	dst = binary.AppendUvarint(dst, uint64(len(s.Loads)))
	for _, l := range s.Loads {
		dst = str(dst, l.Endpoint)
		for _, v := range [...]int{l.Requests, l.KVBlocks, l.Prefill, l.Misses} {
			dst = binary.AppendUvarint(dst, uint64(v))
		}
		dst = binary.AppendUvarint(dst, uint64(len(l.Active)))
		for _, a := range l.Active {
			dst = binary.LittleEndian.AppendUint64(dst, a.Key)
			dst = binary.AppendUvarint(dst, uint64(a.Blocks))
		}
	}
	return dst
}

// section is one section of a version after 2.
type section struct {
	tag  uint64
	body []byte
}

// appendNewer writes s as a replica of version v (> 2) would: v2's body under version
// v, then the sections.
func appendNewer(dst []byte, s *Snapshot, v byte, sections ...section) []byte {
	start := len(dst)
	dst = s.AppendEncode(dst)
	dst[start+1] = v
	for _, sec := range sections {
		dst = binary.AppendUvarint(dst, sec.tag)
		dst = binary.AppendUvarint(dst, uint64(len(sec.body)))
		dst = append(dst, sec.body...)
	}
	return dst
}

func TestSnapshotRoundTrip(t *testing.T) {
	for _, tc := range []struct {
		name    string
		s       Snapshot
		version int
	}{
		{"without turnover: version 2", sample(), 2},
		{"with turnover: version 3", withTurnover(), 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode(tc.s.AppendEncode(nil))
			if err != nil {
				t.Fatal(err)
			}
			sameSnapshot(t, got, tc.s)
			if got.Version != tc.version || got.Loads[1].Active != nil || got.Loads[1].Histories != nil {
				t.Fatalf("version %d, second load's active %v, histories %v: want %d, nil, nil",
					got.Version, got.Loads[1].Active, got.Loads[1].Histories, tc.version)
			}
		})
	}
}

// TestSnapshotV3Golden pins version 3's bytes (v2's body, then the turnover section).
func TestSnapshotV3Golden(t *testing.T) {
	s := withTurnover()
	got := hex.EncodeToString(s.AppendEncode(nil)) + "\n"
	path := filepath.Join("testdata", "snapshot-v3.golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Fatalf("version 3 encoding changed:\ngot  %swant %s", got, want)
	}
}

// TestSnapshotV2Golden pins version 2's bytes: replicas that predate sections accept
// exactly this layout, so a change here breaks rolling upgrades from them (new fields
// go in a section of a new version instead).
func TestSnapshotV2Golden(t *testing.T) {
	s := sample()
	got := hex.EncodeToString(s.AppendEncode(nil)) + "\n"
	path := filepath.Join("testdata", "snapshot-v2.golden")
	if *update {
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got != string(want) {
		t.Fatalf("version 2 encoding changed:\ngot  %swant %s", got, want)
	}
	b, err := hex.DecodeString(strings.TrimSpace(string(want)))
	if err != nil {
		t.Fatal(err)
	}
	dec, err := Decode(b)
	if err != nil {
		t.Fatal(err)
	}
	sameSnapshot(t, dec, s)
}

func TestDecodeVersions(t *testing.T) {
	s := sample()
	v1 := s
	v1.Placements = nil
	unknown := []section{{tag: 2, body: []byte("a v4 field")}, {tag: 1 << 20}, {tag: 9, body: make([]byte, 300)}}
	s3 := withTurnover()
	for _, tc := range []struct {
		name    string
		b       []byte
		want    Snapshot
		version int
	}{
		{"v1: loads, no placements", appendV1(nil, &s), v1, 1},
		{"v2", s.AppendEncode(nil), s, 2},
		{"v3 without sections", appendNewer(nil, &s, 3), s, 3},
		{"v3 with unknown sections", appendNewer(nil, &s, 3, unknown...), s, 3},
		{"v255 with unknown sections", appendNewer(nil, &s, 255, unknown...), s, 255},
		{"v3 with turnover", s3.AppendEncode(nil), s3, 3},
		{"v4 with turnover and unknown sections", appendNewer(nil, &s3, 4, unknown...), s3, 4},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := Decode(tc.b)
			if err != nil {
				t.Fatal(err)
			}
			sameSnapshot(t, got, tc.want)
			if got.Version != tc.version {
				t.Fatalf("Version = %d, want %d", got.Version, tc.version)
			}
		})
	}
}

func TestDecodeRejects(t *testing.T) {
	good := (&Snapshot{Origin: "a", Loads: []placement.EndpointLoad{{Endpoint: "e"}}}).AppendEncode(nil)
	s := sample()
	v3 := appendNewer(nil, &s, 3, section{tag: 1, body: []byte("abc")})
	for _, tc := range []struct {
		name, reason string
		b            []byte
	}{
		{"empty", ReasonMagic, nil},
		{"garbage", ReasonMagic, []byte("GET / HTTP/1.1\r\n")},
		{"no version", ReasonTruncated, []byte{magic}},
		{"version 0", ReasonVersion, []byte{magic, 0, 1, 'a', 0, 0, 0, 0}},
		{"truncated", ReasonTruncated, good[:len(good)-1]},
		{"trailing", ReasonTrailing, append(append([]byte(nil), good...), 0)},
		{"v1 trailing", ReasonTrailing, append(appendV1(nil, &s), 0)},
		{"v3 truncated section", ReasonTruncated, v3[:len(v3)-1]},
		{"v3 section without length", ReasonTruncated, append(appendNewer(nil, &s, 3), 1)},
		{"v3 turnover truncated", ReasonTruncated, appendNewer(nil, &s, 3, section{tag: tagTurnover, body: []byte{5}})},
		{"v3 huge histories", ReasonLimit, appendNewer(nil, &s, 3, section{tag: tagTurnover, body: []byte{5, 0xff, 0xff, 0x0f}})},
		{"no origin", ReasonInvalid, (&Snapshot{}).AppendEncode(nil)},
		{"huge count", ReasonLimit, append([]byte{magic, version, 1, 'a', 0, 0, 0}, 0xff, 0xff, 0xff, 0xff, 0x0f)},
		{"huge string", ReasonLimit, append([]byte{magic, version}, 0xff, 0x0f)},
		{"varint overflow", ReasonLimit, append([]byte{magic, version, 1, 'a'}, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01)},
		// One placement endpoint "e", one placement of key 0 with one site at index 1.
		{"site out of table", ReasonInvalid, append([]byte{magic, version, 1, 'a', 0, 0, 0, 0, 1, 1, 'e', 1, 0, 0, 0, 0, 0, 0, 0, 0}, 1, 0, 0, 1, 2)},
		{"huge placements", ReasonLimit, append([]byte{magic, version, 1, 'a', 0, 0, 0, 0, 0}, 0xff, 0xff, 0xff, 0xff, 0x0f)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Decode(tc.b)
			var me *MalformedError
			if !errors.Is(err, ErrMalformed) || !errors.As(err, &me) || me.Reason != tc.reason {
				t.Fatalf("Decode = %v, want a malformed snapshot (%s)", err, tc.reason)
			}
			if !strings.Contains(err.Error(), tc.reason) || me.Detail == "" {
				t.Fatalf("error %q names no reason or detail", err)
			}
		})
	}
}

func FuzzDecode(f *testing.F) {
	s := sample()
	f.Add((&Snapshot{Origin: "a", Seq: 1, Loads: []placement.EndpointLoad{{Endpoint: "e", Active: []placement.ActivePrefix{{Key: 1, Blocks: 2}}}}}).AppendEncode(nil))
	f.Add((&Snapshot{Origin: "a", Seq: 2, Placements: []placement.Placement{{Key: 3, Blocks: 4, Sites: []placement.Site{{Endpoint: "e", Home: true}}}}}).AppendEncode(nil))
	f.Add(s.AppendEncode(nil))
	f.Add(appendV1(nil, &s))
	f.Add(appendNewer(nil, &s, 3, section{tag: 1, body: []byte("abc")}, section{tag: 2}))
	s3 := withTurnover()
	f.Add(s3.AppendEncode(nil))
	f.Add([]byte{magic, version})
	f.Fuzz(func(t *testing.T, b []byte) {
		s, err := Decode(b)
		if err != nil {
			var me *MalformedError
			if !errors.As(err, &me) || !slices.Contains(reasons, me.Reason) {
				t.Fatalf("Decode error %v: not a MalformedError with a known reason", err)
			}
			return
		}
		if s.Version < minVersion {
			t.Fatalf("decoded version %d", s.Version)
		}
		// Whatever version it came in, its known part re-encodes as version 2, or 3
		// when it carries turnover.
		want := 2
		if slices.ContainsFunc(s.Loads, func(l placement.EndpointLoad) bool { return l.Sent > 0 || len(l.Histories) > 0 }) {
			want = 3
		}
		again, err := Decode(s.AppendEncode(nil))
		if err != nil || again.Version != want {
			t.Fatalf("re-decoding %+v: %+v, %v", s, again, err)
		}
		sameSnapshot(t, again, s)
	})
}
