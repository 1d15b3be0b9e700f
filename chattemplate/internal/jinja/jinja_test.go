package jinja

import (
	"bytes"
	"encoding/json"
	"errors"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// fromJSON decodes JSON into template values, keeping object key order.
func fromJSON(t testing.TB, raw []byte) Value {
	t.Helper()
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.UseNumber()
	var read func() Value
	read = func() Value {
		tok, err := dec.Token()
		if err != nil {
			t.Fatal(err)
		}
		switch tok := tok.(type) {
		case json.Delim:
			switch tok {
			case '{':
				d := NewDict(4)
				for dec.More() {
					k, err := dec.Token()
					if err != nil {
						t.Fatal(err)
					}
					d.Set(k.(string), read())
				}
				dec.Token()
				return DictValue(d)
			case '[':
				items := []Value{}
				for dec.More() {
					items = append(items, read())
				}
				dec.Token()
				return ListOf(items)
			}
		case string:
			return String(tok)
		case bool:
			return Bool(tok)
		case nil:
			return None()
		case json.Number:
			if strings.ContainsAny(tok.String(), ".eE") {
				f, _ := tok.Float64()
				return Float(f)
			}
			b, _ := new(big.Int).SetString(tok.String(), 10)
			return BigInt(b)
		}
		t.Fatalf("unexpected token %v", tok)
		return Value{}
	}
	return read()
}

type raised struct{ msg string }

func (r *raised) Error() string { return r.msg }

var testOptions = Options{
	TrimBlocks: true, LStripBlocks: true,
	Globals: map[string]Value{
		"raise_exception": FuncValue(func(args []Value, _ []KwArg) (Value, error) {
			s, _ := toStr(args[0])
			return Value{}, &raised{s}
		}),
	},
}

// TestGoldenJinja2 compares every case in testdata/golden.json (rendered by Python
// Jinja2 3.1 with transformers' settings, see gen_golden.py) with this engine: same
// output, or an error where Jinja2 raises.
func TestGoldenJinja2(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join("testdata", "golden.json"))
	if err != nil {
		t.Fatal(err)
	}
	var g struct {
		Vars  json.RawMessage `json:"vars"`
		Cases []struct {
			Template string  `json:"template"`
			Rendered *string `json:"rendered"`
			Error    string  `json:"error"`
		} `json:"cases"`
	}
	if err := json.Unmarshal(raw, &g); err != nil {
		t.Fatal(err)
	}
	vars := MapVars{}
	for _, p := range fromJSON(t, g.Vars).Dict().Pairs() {
		vars[p.Key.Str()] = p.Value
	}
	for _, c := range g.Cases {
		t.Run(c.Template, func(t *testing.T) {
			tmpl, err := Compile(c.Template, testOptions)
			var got string
			if err == nil {
				got, err = tmpl.Render(vars, 0)
			}
			var unsupported *UnsupportedError
			if errors.As(err, &unsupported) {
				t.Fatalf("refused: %v (Jinja2: %q %s)", err, deref(c.Rendered), c.Error)
			}
			if c.Rendered == nil {
				if err == nil {
					t.Fatalf("rendered %q, Jinja2 raised %s", got, c.Error)
				}
				if strings.HasPrefix(c.Error, "TemplateError: ") {
					var r *raised
					if !errors.As(err, &r) || r.msg != strings.TrimPrefix(c.Error, "TemplateError: ") {
						t.Fatalf("got %v, want raise_exception %s", err, c.Error)
					}
				}
				return
			}
			if err != nil {
				t.Fatalf("error %v, Jinja2 rendered %q", err, *c.Rendered)
			}
			if got != *c.Rendered {
				t.Fatalf("\n got: %q\nwant: %q", got, *c.Rendered)
			}
		})
	}
}

func deref(s *string) string {
	if s == nil {
		return ""
	}
	return *s
}
