package chattemplate_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/chattemplate"
	"github.com/kvrouter/kvrouter/internal/testtext"
	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

// goldenNow is the clock gen_golden.py gives strftime_now.
var goldenNow = time.Date(2026, 7, 4, 9, 5, 3, 0, time.UTC)

type goldenCase struct {
	Name           string          `json:"name"`
	Models         []string        `json:"models"`
	ServerDefaults json.RawMessage `json:"server_defaults"`
	Body           json.RawMessage `json:"body"`
}

type goldenResult struct {
	Name          string  `json:"name"`
	Rendered      *string `json:"rendered"`
	Unsupported   string  `json:"unsupported"`
	TemplateError string  `json:"template_error"`
	BadRequest    string  `json:"bad_request"`
}

// InputFromBody extracts the template input from a raw chat completions body, with
// vLLM's defaults, keeping objects as raw JSON.
func inputFromBody(t testing.TB, body []byte) chattemplate.Input {
	t.Helper()
	var b struct {
		Messages             json.RawMessage `json:"messages"`
		Tools                json.RawMessage `json:"tools"`
		ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs"`
		Documents            json.RawMessage `json:"documents"`
		ReasoningEffort      *string         `json:"reasoning_effort"`
		AddGenerationPrompt  *bool           `json:"add_generation_prompt"`
		ContinueFinalMessage bool            `json:"continue_final_message"`
		ChatTemplate         *string         `json:"chat_template"`
	}
	if err := json.Unmarshal(body, &b); err != nil {
		t.Fatalf("body: %v", err)
	}
	in := chattemplate.Input{
		Messages:             b.Messages,
		Tools:                nullToEmpty(b.Tools),
		ChatTemplateKwargs:   nullToEmpty(b.ChatTemplateKwargs),
		Documents:            nullToEmpty(b.Documents),
		AddGenerationPrompt:  b.AddGenerationPrompt == nil || *b.AddGenerationPrompt,
		ContinueFinalMessage: b.ContinueFinalMessage,
		RequestTemplate:      b.ChatTemplate != nil,
	}
	if b.ReasoningEffort != nil {
		in.ReasoningEffort = *b.ReasoningEffort
	}
	return in
}

func nullToEmpty(r json.RawMessage) json.RawMessage {
	if bytes.Equal(bytes.TrimSpace(r), []byte("null")) {
		return nil
	}
	return r
}

// modelTemplates are the models whose own chat template (tokenizer_config.json, fetched
// by `make models`) gen_golden.py renders on the golden conversations, the cases for
// qwen3 and llama3.
var modelTemplates = []string{"deepseek_v3", "gemma3", "gemini", "llama3_1"}

// loadModelTemplate compiles a fetched model's chat template as kvrouter does
// (ParseTokenizerConfig + CompileConfig).
func loadModelTemplate(t testing.TB, model string, defaults json.RawMessage) *chattemplate.Template {
	t.Helper()
	return compileModelTemplate(t, model, chattemplate.Options{DefaultKwargs: defaults})
}

// compileModelTemplate is loadModelTemplate with other options (the golden clock is
// set here).
func compileModelTemplate(t testing.TB, model string, opts chattemplate.Options) *chattemplate.Template {
	t.Helper()
	dir := testmodels.DirWith(t, model, "tokenizer_config.json")
	raw, err := os.ReadFile(filepath.Join(dir, "tokenizer_config.json"))
	if err != nil {
		t.Fatal(err)
	}
	cfg, err := chattemplate.ParseTokenizerConfig(raw)
	if err != nil {
		t.Fatal(err)
	}
	opts.Now = func() time.Time { return goldenNow }
	tmpl, err := chattemplate.CompileConfig(cfg, opts)
	if err != nil {
		t.Fatalf("compile %s: %v", model, err)
	}
	if r := tmpl.Refusal(); r != nil {
		t.Fatalf("%s: %v", model, r)
	}
	return tmpl
}

// loadTemplate compiles a test template (testdata/templates) with its special tokens
// and the golden clock.
func loadTemplate(t testing.TB, model string, defaults json.RawMessage) *chattemplate.Template {
	t.Helper()
	return loadTemplateWith(t, model, chattemplate.Options{DefaultKwargs: defaults})
}

// loadTemplateWith is loadTemplate with other options (the special tokens and clock
// are set here).
func loadTemplateWith(t testing.TB, model string, opts chattemplate.Options) *chattemplate.Template {
	t.Helper()
	src, err := os.ReadFile(filepath.Join("testdata", "templates", model+".jinja"))
	if err != nil {
		t.Fatal(err)
	}
	special := map[string]any{}
	if raw, err := os.ReadFile(filepath.Join("testdata", "templates", model+".special.json")); err == nil {
		var m map[string]json.RawMessage
		if err := json.Unmarshal(raw, &m); err != nil {
			t.Fatal(err)
		}
		for k, v := range m {
			var s string
			if json.Unmarshal(v, &s) == nil {
				special[k] = s
				continue
			}
			var list []string
			if err := json.Unmarshal(v, &list); err != nil {
				t.Fatalf("%s: %v", k, err)
			}
			special[k] = list
		}
	}
	opts.SpecialTokens = special
	opts.Now = func() time.Time { return goldenNow }
	tmpl, err := chattemplate.Compile(string(src), opts)
	if err != nil {
		t.Fatalf("compile %s: %v", model, err)
	}
	if r := tmpl.Refusal(); r != nil {
		t.Fatalf("%s: %v", model, r)
	}
	return tmpl
}

func readCases(t testing.TB) []goldenCase {
	t.Helper()
	cases := testtext.ReadJSONL[goldenCase](t, filepath.Join("testdata", "cases.jsonl"))
	cases = append(cases, testtext.ReadJSONL[goldenCase](t, filepath.Join("testdata", "fuzz_cases.jsonl"))...)
	for i := range cases {
		if len(cases[i].Models) == 0 {
			cases[i].Models = []string{"qwen3", "llama3"}
		}
		if slices.Contains(cases[i].Models, "qwen3") || slices.Contains(cases[i].Models, "llama3") {
			cases[i].Models = append(slices.Clip(cases[i].Models), modelTemplates...)
		}
	}
	return cases
}

func readGolden(t testing.TB, model string) map[string]goldenResult {
	t.Helper()
	out := map[string]goldenResult{}
	for _, r := range testtext.ReadJSONL[goldenResult](t, filepath.Join("testdata", "golden", model+".jsonl")) {
		out[r.Name] = r
	}
	return out
}

// TestGolden asserts byte-identical renders against Python's Jinja2 set up as
// transformers sets it up (testdata/gen_golden.py), for every case and template: the
// test templates, the models' own templates (modelTemplates) and the conversations
// FuzzConversations' generator made (testdata/fuzz_cases.jsonl).
func TestGolden(t *testing.T) {
	cases := readCases(t)
	goldens := map[string]map[string]goldenResult{}
	compiled := map[string]*chattemplate.Template{} // by model and server defaults
	counts := map[string]int{}                      // byte-identical renders per template
	errs := map[string]int{}                        // the same error outcome as Jinja2 per template
	for _, c := range cases {
		for _, model := range c.Models {
			if goldens[model] == nil {
				goldens[model] = readGolden(t, model)
			}
			want, ok := goldens[model][c.Name]
			if !ok {
				t.Fatalf("%s/%s: no golden; run gen_golden.py", model, c.Name)
			}
			t.Run(model+"/"+c.Name, func(t *testing.T) {
				key := model + "\x00" + string(c.ServerDefaults)
				tmpl := compiled[key]
				if tmpl == nil {
					if slices.Contains(modelTemplates, model) {
						tmpl = loadModelTemplate(t, model, c.ServerDefaults)
					} else {
						tmpl = loadTemplate(t, model, c.ServerDefaults)
					}
					compiled[key] = tmpl
				}
				got, err := tmpl.Render(inputFromBody(t, c.Body))
				var unsupported *chattemplate.UnsupportedError
				var raised *chattemplate.TemplateError
				switch {
				case want.Rendered != nil:
					if err != nil {
						t.Fatalf("render: %v", err)
					}
					if got != *want.Rendered {
						t.Fatalf("render differs\n got: %q\nwant: %q", got, *want.Rendered)
					}
					counts[model]++
				case want.Unsupported != "":
					if !errors.As(err, &unsupported) {
						t.Fatalf("want UnsupportedError (%s), got %q, %v", want.Unsupported, got, err)
					}
					errs[model]++
				case want.TemplateError != "":
					if err == nil {
						t.Fatalf("want template error %q, got %q", want.TemplateError, got)
					}
					// Cases named *raise exercise raise_exception: the typed error must
					// carry Jinja2's message; so must any raise_exception.
					isRaise := errors.As(err, &raised)
					if strings.HasSuffix(c.Name, "raise") && !isRaise {
						t.Fatalf("want raise_exception(%q), got %v", want.TemplateError, err)
					}
					if isRaise && raised.Message != want.TemplateError {
						t.Fatalf("raise_exception(%q), want %q", raised.Message, want.TemplateError)
					}
					errs[model]++
				case want.BadRequest != "":
					if !errors.Is(err, chattemplate.ErrBadRequest) {
						t.Fatalf("want ErrBadRequest, got %q, %v", got, err)
					}
					errs[model]++
				}
			})
		}
	}
	t.Logf("byte-identical renders: %v; same error as Jinja2: %v", counts, errs)
}
