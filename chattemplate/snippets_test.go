package chattemplate_test

import (
	"encoding/json"
	"os"
	"path/filepath"
	"testing"

	"github.com/kvrouter/kvrouter/chattemplate"
)

// TestJinjaSnippets compares Jinja features chat templates use (filters, tests, string
// methods, loops, macros, slicing, arithmetic) with Python Jinja2's output: every
// snippet must render identically, or fail where Jinja2 fails.
func TestJinjaSnippets(t *testing.T) {
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
			tmpl, err := chattemplate.Compile(src, chattemplate.Options{SpecialTokens: map[string]any{"bos_token": "<s>"}})
			if err == nil {
				got, err = tmpl.Render(in)
			}
			w := want[i]
			matches := (w.Rendered != nil && err == nil && got == *w.Rendered) || (w.Rendered == nil && err != nil)
			if !matches {
				t.Fatalf("got %q (%v), Jinja2: %+v", got, err, w)
			}
			same++
		})
	}
	t.Logf("%d of %d snippets identical to Jinja2", same, len(snippets))
}
