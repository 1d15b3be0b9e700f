package kvbench

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"flag"
	"image/png"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync/atomic"
	"testing"
	"time"
)

var update = flag.Bool("update", false, "rewrite golden files")

// syntheticResults is a reference-shaped grid with figures that are functions of the cell,
// so every table cell is predictable.
func syntheticResults() []CellResult {
	g := ReferenceGrid([]string{"random", "round-robin", "kv"})
	var out []CellResult
	for i, c := range g.Cells() {
		f := float64(i)
		spp := 1 + f/50
		d50, d99 := 10+f/10, 20+f/10
		s := Summary{
			Requests: 240, HitAny: 1 - f/200, HitFull: 1 - f/150, CachedRatio: 0.857 - f/200,
			TTFTP50Ms: 30 + f, TTFTP99Ms: 100 + 30*f, Throughput: 10 + f/4, ServersPerPrefix: &spp,
			DecisionP50Us: &d50, DecisionP99Us: &d99,
			BoundHitRate: ComputeBound([]int{585, 585, 585, 585, 585, 585}, 16, c.Prefixes, 2032, 339).HitRate,
		}
		s.BoundCachedRatio = 2032.0 / 2371 * s.BoundHitRate
		out = append(out, CellResult{Cell: c, Reps: []Summary{s}, Median: s})
	}
	return out
}

func golden(t *testing.T, name string, got []byte) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.WriteFile(path, got, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("%v (run go test -update to create it)", err)
	}
	if !bytes.Equal(got, want) {
		t.Errorf("%s differs from the golden file; got:\n%s", name, got)
	}
}

func TestWriteTablesGolden(t *testing.T) {
	var b bytes.Buffer
	if err := WriteTables(&b, syntheticResults(), "kv"); err != nil {
		t.Fatal(err)
	}
	golden(t, "tables.golden.md", b.Bytes())
}

func TestWriteSummaryGolden(t *testing.T) {
	r := syntheticResults()[4]
	r.Reps = []Summary{r.Median, r.Median}
	var b bytes.Buffer
	if err := WriteSummary(&b, r); err != nil {
		t.Fatal(err)
	}
	golden(t, "summary.golden.md", b.Bytes())
}

func TestThousands(t *testing.T) {
	for in, want := range map[float64]string{0: "0", 999.4: "999", 1353.4: "1,353", 1234567: "1,234,567", -1500: "-1,500"} {
		if got := thousands(in); got != want {
			t.Errorf("thousands(%v) = %q, want %q", in, got, want)
		}
	}
}

// TestJSONSchema pins the record's keys: every figure, snake_case, for downstream tools.
func TestJSONSchema(t *testing.T) {
	var b bytes.Buffer
	recs := Records(syntheticResults()[:1], "sim", DefaultWorkloadConfig())
	if err := WriteJSON(&b, recs); err != nil {
		t.Fatal(err)
	}
	var got []map[string]any
	if err := json.Unmarshal(b.Bytes(), &got); err != nil {
		t.Fatal(err)
	}
	var keys []string
	for k := range got[0] {
		keys = append(keys, k)
	}
	sort.Strings(keys)
	golden(t, "record-keys.golden.txt", []byte(strings.Join(keys, "\n")+"\n"))
	if got[0]["policy"] != "random" || got[0]["prefixes"] != float64(2) || got[0]["concurrency"] != float64(4) ||
		got[0]["workers"] != float64(6) || got[0]["mode"] != "sim" {
		t.Errorf("record %v", got[0])
	}
	// Unknown figures are null, not zero.
	recs[0].EngineHitRate = nil
	b.Reset()
	_ = WriteJSON(&b, recs)
	if !strings.Contains(b.String(), `"engine_hit_rate": null`) {
		t.Error("unknown engine hit rate not written as null")
	}
}

func TestPlot(t *testing.T) {
	p := CachedRatioPlot(syntheticResults(), 8)
	if len(p.Series) != 4 || p.Series[3].Name != "bound" || !p.Series[3].Dashed {
		t.Fatalf("series %+v", p.Series)
	}
	for _, s := range p.Series {
		if len(s.X) != 4 || s.X[0] != 2 || s.X[3] != 24 {
			t.Errorf("series %s x %v", s.Name, s.X)
		}
	}
	t.Run("svg", func(t *testing.T) {
		var b bytes.Buffer
		if err := p.WriteSVG(&b); err != nil {
			t.Fatal(err)
		}
		dec := xml.NewDecoder(&b)
		lines := 0
		for {
			tok, err := dec.Token()
			if err != nil {
				if err.Error() != "EOF" {
					t.Fatalf("not well-formed XML: %v", err)
				}
				break
			}
			if se, ok := tok.(xml.StartElement); ok && se.Name.Local == "polyline" {
				lines++
			}
		}
		if lines != 5 { // the axes and four series
			t.Errorf("%d polylines, want 5", lines)
		}
	})
	t.Run("png", func(t *testing.T) {
		var b bytes.Buffer
		if err := p.WritePNG(&b); err != nil {
			t.Fatal(err)
		}
		img, err := png.Decode(&b)
		if err != nil {
			t.Fatal(err)
		}
		if img.Bounds().Dx() != 720 || img.Bounds().Dy() != 450 {
			t.Errorf("size %v", img.Bounds())
		}
		// The first series' colour appears (its line was drawn).
		c := palette[0]
		found := false
		for y := 0; y < 450 && !found; y++ {
			for x := 0; x < 720; x++ {
				r, g, bl, _ := img.At(x, y).RGBA()
				if uint8(r>>8) == c.R && uint8(g>>8) == c.G && uint8(bl>>8) == c.B {
					found = true
					break
				}
			}
		}
		if !found {
			t.Error("first series not drawn")
		}
	})
}

func TestSweep(t *testing.T) {
	g := Grid{Policies: []string{"a", "b"}, Workers: 2, Prefixes: []int{1, 2}, Concurrency: []int{3}, Repetitions: 3}
	var calls atomic.Int32
	run := func(_ context.Context, c Cell, rep int) (Summary, error) {
		calls.Add(1)
		return Summary{CachedRatio: float64(c.Prefixes) + float64(rep)/10}, nil
	}
	var done atomic.Int32
	res, err := Sweep(context.Background(), g, 3, run, func() { done.Add(1) })
	if err != nil {
		t.Fatal(err)
	}
	if calls.Load() != 12 || done.Load() != 12 || len(res) != 4 {
		t.Fatalf("calls %d done %d cells %d", calls.Load(), done.Load(), len(res))
	}
	for _, r := range res {
		if len(r.Reps) != 3 || !near(r.Median.CachedRatio, float64(r.Prefixes)+0.1) {
			t.Errorf("cell %v: median %v", r.Cell, r.Median.CachedRatio)
		}
	}
	if res[0].Policy != "a" || res[1].Policy != "b" || res[0].Prefixes != 1 || res[2].Prefixes != 2 {
		t.Errorf("cells out of grid order: %v", res)
	}

	boom := errors.New("boom")
	_, err = Sweep(context.Background(), g, 2, func(_ context.Context, c Cell, rep int) (Summary, error) {
		if c.Policy == "b" {
			return Summary{}, boom
		}
		return Summary{}, nil
	}, nil)
	if !errors.Is(err, boom) {
		t.Errorf("err %v, want boom", err)
	}
}

func TestProgress(t *testing.T) {
	now := time.Unix(0, 0)
	clock := func() time.Time { return now }
	t.Run("not a terminal: quiet, then periodic lines", func(t *testing.T) {
		var b bytes.Buffer
		p := NewProgress(&b, false, "x", 10, clock)
		p.Add(1)
		if b.Len() != 0 {
			t.Fatalf("wrote %q during the quiet period", b.String())
		}
		now = now.Add(4 * time.Second)
		p.Add(1)
		if !strings.Contains(b.String(), "2/10") {
			t.Fatalf("got %q", b.String())
		}
		n := b.Len()
		now = now.Add(time.Second)
		p.Add(1)
		if b.Len() != n {
			t.Error("wrote again before the interval")
		}
		p.Add(7)
		if !strings.Contains(b.String(), "10/10 100%") {
			t.Errorf("final line missing: %q", b.String())
		}
	})
	t.Run("terminal: redraws in place", func(t *testing.T) {
		var b bytes.Buffer
		p := NewProgress(&b, true, "x", 2, clock)
		p.Add(1)
		now = now.Add(time.Second)
		p.Add(1)
		p.Finish()
		if !strings.HasPrefix(b.String(), "\r") || !strings.HasSuffix(b.String(), "\n") || !strings.Contains(b.String(), "2/2") {
			t.Errorf("got %q", b.String())
		}
	})
}
