package testtext_test

import (
	"compress/gzip"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/internal/testtext"
)

func TestProse(t *testing.T) {
	a := testtext.Prose(1, 400)
	if b := testtext.Prose(1, 400); a != b {
		t.Fatal("the same seed gave two texts")
	}
	if n := len(strings.Fields(a)); n != 300 {
		t.Errorf("%d words for 400 tokens, want 300", n)
	}
	if c := testtext.Prose(2, 400); c[:40] == a[:40] {
		t.Errorf("seeds 1 and 2 share a prefix: %q", a[:40])
	}
}

type rec struct {
	Name string `json:"name"`
}

func TestReadJSONL(t *testing.T) {
	dir := t.TempDir()
	const body = `{"name":"a"}` + "\n\n" + `{"name":"b"}` + "\n"
	plain := filepath.Join(dir, "x.jsonl")
	if err := os.WriteFile(plain, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	gz := filepath.Join(dir, "x.jsonl.gz")
	f, err := os.Create(gz)
	if err != nil {
		t.Fatal(err)
	}
	zw := gzip.NewWriter(f)
	fmt.Fprint(zw, body)
	if err := zw.Close(); err != nil {
		t.Fatal(err)
	}
	f.Close()
	for _, path := range []string{plain, gz} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			got := testtext.ReadJSONL[rec](t, path)
			if len(got) != 2 || got[0].Name != "a" || got[1].Name != "b" {
				t.Errorf("got %+v", got)
			}
		})
	}
}

// fatalTB records the first fatal message and stops the goroutine, as testing.T does.
type fatalTB struct {
	testing.TB
	msg string
}

func (f *fatalTB) Helper() {}
func (f *fatalTB) Fatal(args ...any) {
	f.msg = fmt.Sprint(args...)
	runtime.Goexit()
}
func (f *fatalTB) Fatalf(format string, args ...any) {
	f.msg = fmt.Sprintf(format, args...)
	runtime.Goexit()
}

func TestReadJSONLFails(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.jsonl")
	if err := os.WriteFile(bad, []byte(`{"name":"a"}`+"\n"+`{"name":`+"\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	notGzip := filepath.Join(dir, "plain.jsonl.gz")
	if err := os.WriteFile(notGzip, []byte(`{"name":"a"}`), 0o644); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct{ name, path, want string }{
		{"bad line", bad, "bad.jsonl line 2:"},
		{"missing file", filepath.Join(dir, "none.jsonl"), "none.jsonl"},
		{"not gzip", notGzip, "plain.jsonl.gz:"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tb := &fatalTB{TB: t}
			done := make(chan struct{})
			go func() {
				defer close(done)
				testtext.ReadJSONL[rec](tb, tc.path)
			}()
			<-done
			if !strings.Contains(tb.msg, tc.want) {
				t.Errorf("failure %q, want it to name %q", tb.msg, tc.want)
			}
		})
	}
}
