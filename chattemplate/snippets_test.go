package chattemplate_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvrouter/kvrouter/chattemplate"
)

// knownGonjaGaps are the snippets where gonja (the fallback engine) is known to
// differ from Jinja2; the test asserts they still differ so that a fix gets noticed
// and the list shrinks. The native engine has no gaps: it must match every snippet.
var knownGonjaGaps = map[string]string{
	"{{ '%s-%d' % ('a', 3) }}": "gonja has no Python %-formatting (it panics; Render reports ErrEnginePanic)",
	"{{ d | dictsort }}":       "pairs print as lists, not tuples",
	"{{ d.items() | list }}":   "pairs print as lists, not tuples",
	"{{ x | string + 'z' }}{{ 3.0 }}{{ 1/2 }}{{ 7//2 }}{{ 2**3 }}{{ 7 % 3 }}": "int ** int is a float in gonja",
	"{{ none }}|{{ tools }}|{{ undefined_var }}|":                             "the none literal prints as an empty string (None from request data prints None)",
	"{{ '\\u00e9' | length }}{{ 'héllo'[1] }}{{ 'héllo' | upper }}":           "gonja indexes a string by byte, not by character",
}

// TestJinjaSnippets compares Jinja features chat templates use (filters, tests, string
// methods, loops, macros, slicing, arithmetic) with Python Jinja2's output, on both
// engines.
func TestJinjaSnippets(t *testing.T) {
	for _, engine := range []string{chattemplate.EngineNative, chattemplate.EngineGonja} {
		t.Run(engine, func(t *testing.T) { testJinjaSnippets(t, engine) })
	}
}

func testJinjaSnippets(t *testing.T, engine string) {
	gaps := knownGonjaGaps
	if engine == chattemplate.EngineNative {
		gaps = nil
	}
	var snippets []string
	var want []struct {
		Rendered *string `json:"rendered"`
		Error    string  `json:"error"`
	}
	for path, v := range map[string]any{"snippets.json": &snippets, filepath.Join("golden", "snippets.json"): &want} {
		raw, err := os.ReadFile(filepath.Join("testdata", path))
		if err != nil {
			t.Fatal(err)
		}
		if err := json.Unmarshal(raw, v); err != nil {
			t.Fatal(err)
		}
	}
	if len(snippets) != len(want) {
		t.Fatalf("%d snippets, %d goldens: run gen_golden.py", len(snippets), len(want))
	}
	in := chattemplate.Input{
		Messages:            json.RawMessage(`[{"role":"user","content":"hi"},{"role":"assistant","content":"yo"}]`),
		ChatTemplateKwargs:  json.RawMessage(`{"x":1,"y":2,"items":["a","b"],"d":{"b":1,"a":2}}`),
		AddGenerationPrompt: true,
	}
	same := 0
	for i, src := range snippets {
		t.Run(src, func(t *testing.T) {
			var got string
			tmpl, err := chattemplate.Compile(src, chattemplate.Options{SpecialTokens: map[string]any{"bos_token": "<s>"}, Engine: engine})
			if err == nil {
				got, err = tmpl.Render(in)
			}
			w := want[i]
			matches := (w.Rendered != nil && err == nil && got == *w.Rendered) || (w.Rendered == nil && err != nil)
			if gap, known := gaps[src]; known {
				if matches {
					t.Fatalf("known gap (%s) now matches Jinja2: remove it from knownGonjaGaps", gap)
				}
				return
			}
			if !matches {
				t.Fatalf("got %q (%v), Jinja2: %+v", got, err, w)
			}
			same++
		})
	}
	t.Logf("%s: %d of %d snippets identical to Jinja2, %d known gaps", engine, same, len(snippets), len(gaps))
}
