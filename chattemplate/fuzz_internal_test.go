package chattemplate

import (
	"testing"

	"github.com/kvrouter/kvrouter/chattemplate/internal/jinja"
)

// FuzzDecodeJSON: the decoder never panics, and whatever it accepts tojson can print.
func FuzzDecodeJSON(f *testing.F) {
	for _, s := range []string{`{"a":[1,2.0,-0.0,1e-07,123456789012345678901234567890]}`, `"\ud83d\ude00"`, `[{"b":{"c":null}}, true]`, `{`, `"\ud800"`} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := decodeJSON(data)
		if err != nil {
			return
		}
		if _, err := jinja.Dumps(v, jinja.DefaultDumpOptions()); err != nil {
			t.Fatalf("decoded value cannot be dumped: %v", err)
		}
	})
}
