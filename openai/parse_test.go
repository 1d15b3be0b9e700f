package openai_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"slices"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvrouter/kvrouter/openai"
)

func TestParse(t *testing.T) {
	tests := []struct {
		name string
		path string
		body string
		want openai.Request
	}{
		{
			name: "chat defaults",
			path: "/v1/chat/completions",
			body: `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
			want: openai.Request{Model: "m", Kind: openai.KindChat, Messages: []byte(`[{"role":"user","content":"hi"}]`),
				AddGenerationPrompt: true, AddSpecialTokens: false},
		},
		{
			name: "chat all fields",
			path: "/v1/chat/completions?x=1",
			body: `{"model":"lora-a","messages":[{"content":"x","role":"system"}],"tools":[{"type":"function"}],
				"chat_template_kwargs":{"enable_thinking":false},"chat_template":"{{ x }}","add_generation_prompt":false,
				"continue_final_message":true,"add_special_tokens":true,"stream":true,"stream_options":{"include_usage":true},
				"cache_salt":"s1","reasoning_effort":"none","documents":[{"title":"t"}],"truncate_prompt_tokens":100}`,
			want: openai.Request{Model: "lora-a", Kind: openai.KindChat, Messages: []byte(`[{"content":"x","role":"system"}]`),
				Tools: []byte(`[{"type":"function"}]`), ChatTemplateKwargs: []byte(`{"enable_thinking":false}`),
				ChatTemplate: "{{ x }}", AddGenerationPrompt: false, ContinueFinalMessage: true, AddSpecialTokens: true,
				Stream: true, IncludeUsage: true, CacheSalt: "s1", ReasoningEffort: "none",
				Documents: []byte(`[{"title":"t"}]`), TruncatePromptTokens: intPtr(100)},
		},
		{
			name: "nulls mean defaults",
			path: "/v1/chat/completions",
			body: `{"model":"m","messages":[],"tools":null,"add_generation_prompt":null,"stream_options":null,"cache_salt":null}`,
			want: openai.Request{Model: "m", Kind: openai.KindChat, Messages: []byte(`[]`), AddGenerationPrompt: true},
		},
		{
			// The chat template validates the messages as it decodes them.
			name: "messages delimited, not validated",
			path: "/v1/chat/completions",
			body: "{\"model\":\"m\",\"messages\":[{\"content\":\"\xff\x01\\\"]\\\\\"} 1 2,],\"stream\":true}",
			want: openai.Request{Model: "m", Kind: openai.KindChat, Messages: []byte("[{\"content\":\"\xff\x01\\\"]\\\\\"} 1 2,]"),
				AddGenerationPrompt: true, Stream: true},
		},
		{
			name: "escapes, duplicates and whitespace",
			path: "/v1/completions",
			body: " \n{ \"model\" : \"old\", \"model\":\"m\\u00e9\\n\", \"prompt\" : [ [1, 2] , [4294967295] ], \"x\": {\"y\": [-1.5e-3, true, null]} }\t",
			want: openai.Request{Model: "m\u00e9\n", Kind: openai.KindCompletions, Prompt: []byte(`[ [1, 2] , [4294967295] ]`),
				AddGenerationPrompt: true, AddSpecialTokens: true},
		},
		{
			name: "escaped keys",
			path: "/v1/chat/completions",
			body: `{"mod\u0065l":"m","messages":[],"stream_opti\u006fns":{"include_\u0075sage":true}}`,
			want: openai.Request{Model: "m", Kind: openai.KindChat, Messages: []byte(`[]`), AddGenerationPrompt: true, IncludeUsage: true},
		},
		{
			name: "completion string prompt",
			path: "/v1/completions",
			body: `{"model":"m","prompt":"hello","stream":false}`,
			want: openai.Request{Model: "m", Kind: openai.KindCompletions, Prompt: []byte(`"hello"`),
				AddGenerationPrompt: true, AddSpecialTokens: true},
		},
		{
			name: "completion list of strings",
			path: "/v1/completions",
			body: `{"model":"m","prompt":["a","b"],"add_special_tokens":false}`,
			want: openai.Request{Model: "m", Kind: openai.KindCompletions, Prompt: []byte(`["a","b"]`), AddGenerationPrompt: true},
		},
		{
			name: "completion token ids",
			path: "/v1/completions",
			body: `{"model":"m","prompt":[1,2,3]}`,
			want: openai.Request{Model: "m", Kind: openai.KindCompletions, Prompt: []byte(`[1,2,3]`), AddGenerationPrompt: true, AddSpecialTokens: true},
		},
		{
			name: "completion lists of token ids",
			path: "/v1/completions",
			body: `{"model":"m","prompt":[[1,2],[3]]}`,
			want: openai.Request{Model: "m", Kind: openai.KindCompletions, Prompt: []byte(`[[1,2],[3]]`), AddGenerationPrompt: true, AddSpecialTokens: true},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(tc.body)
			orig := bytes.Clone(body)
			got, err := openai.Parse(tc.path, body)
			if err != nil {
				t.Fatalf("Parse: %v", err)
			}
			if !bytes.Equal(body, orig) {
				t.Fatal("Parse modified the body")
			}
			if got.Model != tc.want.Model || got.Kind != tc.want.Kind || !bytes.Equal(got.Prompt, tc.want.Prompt) ||
				!bytes.Equal(got.Messages, tc.want.Messages) || !bytes.Equal(got.Tools, tc.want.Tools) ||
				!bytes.Equal(got.ChatTemplateKwargs, tc.want.ChatTemplateKwargs) || got.ChatTemplate != tc.want.ChatTemplate ||
				got.AddGenerationPrompt != tc.want.AddGenerationPrompt || got.ContinueFinalMessage != tc.want.ContinueFinalMessage ||
				got.AddSpecialTokens != tc.want.AddSpecialTokens || got.Stream != tc.want.Stream ||
				got.IncludeUsage != tc.want.IncludeUsage || got.CacheSalt != tc.want.CacheSalt {
				t.Fatalf("got %+v\nwant %+v", *got, tc.want)
			}
		})
	}
}

// TestParseMaxTokens: the output bound is max_completion_tokens before max_tokens on chat
// (vLLM's order), max_tokens on completions (vLLM's default, 16, when the member is
// absent; a null is None there, unknown here), and 0 for anything but a positive integer,
// which never fails the parse (vLLM judges the value; the router only reads a bound).
func TestParseMaxTokens(t *testing.T) {
	for _, tc := range []struct {
		name, path, fields string
		want               int
	}{
		{"absent", "/v1/chat/completions", ``, 0},
		{"completions absent", "/v1/completions", ``, openai.DefaultCompletionMaxTokens},
		{"completions null", "/v1/completions", `,"max_tokens":null`, 0},
		{"completions null last", "/v1/completions", `,"max_tokens":5,"max_tokens":null`, 0},
		{"chat max_tokens", "/v1/chat/completions", `,"max_tokens":500`, 500},
		{"chat max_completion_tokens first", "/v1/chat/completions", `,"max_tokens":500,"max_completion_tokens":20`, 20},
		{"chat null max_completion_tokens", "/v1/chat/completions", `,"max_completion_tokens":null,"max_tokens":7`, 7},
		{"completions max_tokens", "/v1/completions", `,"max_tokens":100`, 100},
		{"completions ignore max_completion_tokens", "/v1/completions", `,"max_completion_tokens":100`, openai.DefaultCompletionMaxTokens},
		{"integral float", "/v1/completions", `,"max_tokens":1.28e2`, 128},
		{"last key wins", "/v1/completions", `,"max_tokens":3,"max_tokens":4`, 4},
		{"zero", "/v1/completions", `,"max_tokens":0`, 0},
		{"negative", "/v1/completions", `,"max_tokens":-5`, 0},
		{"fraction", "/v1/completions", `,"max_tokens":2.5`, 0},
		{"string", "/v1/completions", `,"max_tokens":"9"`, 0},
		{"huge", "/v1/completions", `,"max_tokens":1e30`, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := `{"model":"m","prompt":"x","messages":[]` + tc.fields + `}`
			got, err := openai.Parse(tc.path, []byte(body))
			if err != nil {
				t.Fatal(err)
			}
			if got.MaxTokens != tc.want {
				t.Errorf("MaxTokens = %d, want %d", got.MaxTokens, tc.want)
			}
		})
	}
}

func TestParseErrors(t *testing.T) {
	tests := []struct {
		name, path, body, reason, field string
	}{
		{"unsupported path", "/v1/embeddings", `{"model":"m"}`, openai.ReasonUnsupportedPath, ""},
		{"models path", "/v1/models", ``, openai.ReasonUnsupportedPath, ""},
		{"not utf8", "/v1/completions", "{\"model\":\"m\xff\",\"prompt\":\"x\"}", openai.ReasonNonUTF8, ""},
		{"truncated", "/v1/completions", `{"model":"m","prompt":"x`, openai.ReasonMalformedJSON, ""},
		{"empty", "/v1/completions", ``, openai.ReasonMalformedJSON, ""},
		{"null body", "/v1/completions", `null`, openai.ReasonMalformedJSON, ""},
		{"array body", "/v1/completions", `[1]`, openai.ReasonMalformedJSON, ""},
		{"trailing data", "/v1/completions", `{"model":"m","prompt":"x"} x`, openai.ReasonMalformedJSON, ""},
		{"two objects", "/v1/completions", `{"model":"m","prompt":"x"}{}`, openai.ReasonMalformedJSON, ""},
		{"leading zero", "/v1/completions", `{"model":"m","prompt":"x","n":01}`, openai.ReasonMalformedJSON, ""},
		{"bad escape", "/v1/completions", `{"model":"m","prompt":"\x"}`, openai.ReasonMalformedJSON, ""},
		{"control char", "/v1/completions", "{\"model\":\"m\",\"prompt\":\"a\tb\"}", openai.ReasonMalformedJSON, ""},
		{"trailing comma", "/v1/completions", `{"model":"m","prompt":"x",}`, openai.ReasonMalformedJSON, ""},
		{"too deep", "/v1/chat/completions", `{"model":"m","messages":[],"tools":` + strings.Repeat("[", 10001) + strings.Repeat("]", 10001) + `}`, openai.ReasonMalformedJSON, ""},
		{"unterminated messages", "/v1/chat/completions", `{"model":"m","messages":[{"a":"]}`, openai.ReasonMalformedJSON, ""},
		{"bad earlier messages", "/v1/chat/completions", `{"model":"m","messages":[1,],"messages":[]}`, openai.ReasonMalformedJSON, "messages"},
		{"bad messages replaced by null", "/v1/chat/completions", `{"model":"m","messages":[1 2],"messages":null}`, openai.ReasonMalformedJSON, "messages"},
		{"not utf8 beside messages", "/v1/chat/completions", "{\"model\":\"m\",\"messages\":[],\"x\":\"\xff\"}", openai.ReasonNonUTF8, ""},
		{"not utf8 in earlier messages", "/v1/chat/completions", "{\"model\":\"m\",\"messages\":[\"\xff\"],\"messages\":[]}", openai.ReasonNonUTF8, ""},
		{"not utf8 and malformed", "/v1/chat/completions", "{\"model\":\"m\xff\",", openai.ReasonNonUTF8, ""},
		{"messages of a completion validated", "/v1/completions", `{"model":"m","prompt":"x","messages":[1,]}`, openai.ReasonMalformedJSON, ""},
		{"prompt id too big", "/v1/completions", `{"model":"m","prompt":[4294967296]}`, openai.ReasonMalformedJSON, "prompt"},
		{"prompt float id", "/v1/completions", `{"model":"m","prompt":[1.0]}`, openai.ReasonMalformedJSON, "prompt"},
		{"no model", "/v1/completions", `{"prompt":"x"}`, openai.ReasonMissingModel, "model"},
		{"null model", "/v1/completions", `{"model":null,"prompt":"x"}`, openai.ReasonMissingModel, "model"},
		{"empty model", "/v1/completions", `{"model":"","prompt":"x"}`, openai.ReasonMissingModel, "model"},
		{"model case matters", "/v1/completions", `{"MODEL":"m","prompt":"x"}`, openai.ReasonMissingModel, "model"},
		{"model not string", "/v1/completions", `{"model":7,"prompt":"x"}`, openai.ReasonMalformedJSON, "model"},
		{"no prompt", "/v1/completions", `{"model":"m"}`, openai.ReasonMalformedJSON, "prompt"},
		{"prompt object", "/v1/completions", `{"model":"m","prompt":{}}`, openai.ReasonMalformedJSON, "prompt"},
		{"prompt mixed", "/v1/completions", `{"model":"m","prompt":["a",1]}`, openai.ReasonMalformedJSON, "prompt"},
		{"prompt negative id", "/v1/completions", `{"model":"m","prompt":[-1]}`, openai.ReasonMalformedJSON, "prompt"},
		{"prompt empty list", "/v1/completions", `{"model":"m","prompt":[]}`, openai.ReasonMalformedJSON, "prompt"},
		{"no messages", "/v1/chat/completions", `{"model":"m"}`, openai.ReasonMalformedJSON, "messages"},
		{"messages object", "/v1/chat/completions", `{"model":"m","messages":{}}`, openai.ReasonMalformedJSON, "messages"},
		{"tools object", "/v1/chat/completions", `{"model":"m","messages":[],"tools":{}}`, openai.ReasonMalformedJSON, "tools"},
		{"kwargs list", "/v1/chat/completions", `{"model":"m","messages":[],"chat_template_kwargs":[]}`, openai.ReasonMalformedJSON, "chat_template_kwargs"},
		{"stream string", "/v1/chat/completions", `{"model":"m","messages":[],"stream":"yes"}`, openai.ReasonMalformedJSON, "stream"},
		{"include_usage string", "/v1/chat/completions", `{"model":"m","messages":[],"stream_options":{"include_usage":1}}`, openai.ReasonMalformedJSON, "stream_options.include_usage"},
		{"stream_options list", "/v1/chat/completions", `{"model":"m","messages":[],"stream_options":[]}`, openai.ReasonMalformedJSON, "stream_options"},
		{"salt number", "/v1/chat/completions", `{"model":"m","messages":[],"cache_salt":1}`, openai.ReasonMalformedJSON, "cache_salt"},
		{"reasoning_effort number", "/v1/chat/completions", `{"model":"m","messages":[],"reasoning_effort":1}`, openai.ReasonMalformedJSON, "reasoning_effort"},
		{"documents object", "/v1/chat/completions", `{"model":"m","messages":[],"documents":{}}`, openai.ReasonMalformedJSON, "documents"},
		{"truncate below -1", "/v1/completions", `{"model":"m","prompt":"x","truncate_prompt_tokens":-2}`, openai.ReasonMalformedJSON, "truncate_prompt_tokens"},
		{"truncate float", "/v1/completions", `{"model":"m","prompt":"x","truncate_prompt_tokens":1.5}`, openai.ReasonMalformedJSON, "truncate_prompt_tokens"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			_, err := openai.Parse(tc.path, []byte(tc.body))
			var pe *openai.ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("err = %v, want *ParseError", err)
			}
			if pe.Reason != tc.reason || pe.Field != tc.field {
				t.Fatalf("reason/field = %q/%q, want %q/%q (%v)", pe.Reason, pe.Field, tc.reason, tc.field, err)
			}
			if !strings.HasPrefix(err.Error(), "openai: "+tc.reason) {
				t.Fatalf("message %q", err)
			}
		})
	}
}

func TestKindOf(t *testing.T) {
	for path, want := range map[string]openai.Kind{
		"/v1/completions": openai.KindCompletions, "/v1/chat/completions?a=b": openai.KindChat,
		"/v1/models": openai.KindUnknown, "": openai.KindUnknown, "/v1/chat/completions/": openai.KindUnknown,
	} {
		if got := openai.KindOf(path); got != want {
			t.Errorf("KindOf(%q) = %v, want %v", path, got, want)
		}
	}
}

func FuzzParse(f *testing.F) {
	f.Add("/v1/chat/completions", []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"stream":true}`))
	f.Add("/v1/completions", []byte(`{"model":"m","prompt":[[1,2],[3]]}`))
	f.Add("/v1/completions", []byte(`{"model":"m","prompt":["a"],"stream_options":{"include_usage":true}}`))
	f.Add("/v1/completions", []byte("\xff"))
	f.Add("/v1/chat/completions", []byte(` {"model":"m\u00e9","messages":[{"a":[1.5e3,-0,true,null,"\\\"x"]}]} `))
	f.Add("/v1/completions", []byte(`{"model":"m","prompt":[[1,2],[]],"x":{"y":[01]}}`))
	f.Add("/v1/chat/completions", []byte(`{"model":"m","messages":[],"max_tokens":5,"max_completion_tokens":6.0}`))
	f.Fuzz(func(t *testing.T, path string, body []byte) {
		orig := bytes.Clone(body)
		req, err := openai.Parse(path, body)
		if !bytes.Equal(orig, body) {
			t.Fatal("body modified")
		}
		// Differential check against encoding/json's validator. Parse delimits a chat
		// body's messages without validating them: with that list replaced by a valid
		// one, what Parse accepts must be valid.
		if err == nil {
			checked := body
			if req.Messages != nil {
				start := cap(body) - cap(req.Messages) // a sub-slice of body
				checked = slices.Concat(body[:start], []byte("[]"), body[start+len(req.Messages):])
			}
			if !utf8.Valid(checked) || !json.Valid(checked) {
				t.Fatalf("accepted invalid JSON %q", body)
			}
			// A rewritten model parses back, the rest of the request unchanged.
			const model = "rewritten\"/<model>"
			again, err := openai.Parse(path, req.WithModel(body, model))
			if err != nil || again.Model != model || again.Stream != req.Stream || again.CacheSalt != req.CacheSalt ||
				!bytes.Equal(again.Messages, req.Messages) || !bytes.Equal(again.Prompt, req.Prompt) {
				t.Fatalf("WithModel(%q): %+v, %v", body, again, err)
			}
			// MaxTokens against encoding/json's reading of the same keys (the last wins).
			var m map[string]json.RawMessage
			if json.Unmarshal(checked, &m) == nil {
				want := refPositiveInt(m["max_tokens"])
				if n := refPositiveInt(m["max_completion_tokens"]); n > 0 && req.Kind == openai.KindChat {
					want = n
				}
				if _, ok := m["max_tokens"]; !ok && req.Kind == openai.KindCompletions {
					want = openai.DefaultCompletionMaxTokens
				}
				if req.MaxTokens != want || again.MaxTokens != want {
					t.Fatalf("MaxTokens %d (after WithModel %d), want %d: %q", req.MaxTokens, again.MaxTokens, want, body)
				}
			}
		}
		if utf8.Valid(body) && openai.KindOf(path) != openai.KindUnknown {
			valid := json.Valid(body)
			var pe *openai.ParseError
			isObject := len(bytes.TrimLeft(body, " \t\r\n")) > 0 && bytes.TrimLeft(body, " \t\r\n")[0] == '{'
			if valid && isObject && errors.As(err, &pe) && pe.Reason == openai.ReasonMalformedJSON && pe.Field == "" {
				t.Fatalf("rejected valid JSON %q: %v", body, err)
			}
		}
		if err != nil {
			var pe *openai.ParseError
			if !errors.As(err, &pe) || pe.Reason == "" {
				t.Fatalf("untyped error %v", err)
			}
			return
		}
		if req.Model == "" || req.Kind == openai.KindUnknown {
			t.Fatalf("accepted request without model or kind: %+v", req)
		}
	})
}

func intPtr(n int) *int { return &n }

// TestParseStringBytesAtEveryOffset puts each byte that ends or breaks a JSON string's
// plain run ('"', '\\', control characters, and neighbours of the scanner's 8-byte
// blocks) at every offset of a long string, so both the word-at-a-time and the bytewise
// paths meet it; the verdict must agree with encoding/json.
func TestParseStringBytesAtEveryOffset(t *testing.T) {
	specials := []string{`"`, `\`, `\"`, `\\`, `\n`, `\u00e9`, `\x`, "\x00", "\x1f", "\x20", "\x21", "\x7f", "é", "\n", "\t", "[", "]"}
	for _, sp := range specials {
		for off := 0; off < 24; off++ {
			for _, tail := range []int{0, 1, 7, 8, 9} {
				content := strings.Repeat("a", off) + sp + strings.Repeat("b", tail)
				body := []byte(`{"model":"m","prompt":"` + content + `"}`)
				t.Run("", func(t *testing.T) {
					req, err := openai.Parse("/v1/completions", body)
					if valid := json.Valid(body); valid != (err == nil) {
						t.Fatalf("%q: json.Valid=%v, Parse err=%v", body, valid, err)
					}
					if err == nil && req.Model != "m" {
						t.Fatalf("%q: model %q", body, req.Model)
					}
				})
			}
		}
	}
}

// benchChatBody is a ~2,400-token chat request (~10 KB).
func benchChatBody() []byte {
	words := strings.Repeat("the quick brown fox jumps over the lazy dog. ", 210)
	return []byte(`{"model":"model","messages":[{"role":"system","content":"You are a helpful assistant."},` +
		`{"role":"user","content":"` + words + `"}],"stream":true,"stream_options":{"include_usage":true},"max_tokens":128}`)
}

// BenchmarkParse is the body parse of benchChatBody.
func BenchmarkParse(b *testing.B) {
	body := benchChatBody()
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := openai.Parse("/v1/chat/completions", body); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkParseEncodingJSON is the baseline for BenchmarkParse: encoding/json decoding
// the same body into the fields Parse reads (with messages' content as raw JSON, as Parse
// keeps it), after the same validity check.
func BenchmarkParseEncodingJSON(b *testing.B) {
	body := benchChatBody()
	type message struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	var req struct {
		Model         string    `json:"model"`
		Messages      []message `json:"messages"`
		Stream        bool      `json:"stream"`
		StreamOptions *struct {
			IncludeUsage bool `json:"include_usage"`
		} `json:"stream_options"`
		MaxTokens *int   `json:"max_tokens"`
		CacheSalt string `json:"cache_salt"`
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for b.Loop() {
		if !json.Valid(body) {
			b.Fatal("invalid")
		}
		if err := json.Unmarshal(body, &req); err != nil {
			b.Fatal(err)
		}
	}
}

// refValueEnd is ValueEnd written byte by byte, the reference FuzzValueEnd checks it
// against: in a string a backslash takes the next byte with it and a quote ends it.
func refValueEnd(b []byte, i int) (int, bool) {
	depth := 0
	for i < len(b) {
		switch b[i] {
		case '"':
			j := i + 1
			for ; j < len(b) && b[j] != '"'; j++ {
				if b[j] == '\\' {
					j++
				}
			}
			if j >= len(b) {
				return 0, false
			}
			i = j + 1
			if depth == 0 {
				return i, true
			}
			continue
		case '{', '[':
			depth++
		case '}', ']':
			depth--
			if depth < 0 {
				return 0, false
			}
			if depth == 0 {
				return i + 1, true
			}
		case ',', ' ', '\t', '\n', '\r':
			if depth == 0 {
				return i, true
			}
		}
		i++
	}
	return i, depth == 0
}

// FuzzValueEnd checks ValueEnd (its strings' quotes found with IndexByte, the
// backslashes before each counted) against refValueEnd from every offset of any
// input, and that it delimits a valid JSON list, object or string whole (json.Valid
// allows white space after it).
func FuzzValueEnd(f *testing.F) {
	f.Add([]byte(`[{"role":"user","content":"hi \"there\" \\"},{"a":[1,"]"]}]`))
	f.Add([]byte(`"0123456789abcdef\"0123456789abcdef\\\"x"`))
	f.Add([]byte(`["\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\\""]`))
	f.Add([]byte(`{"k":"unterminated`))
	f.Fuzz(func(t *testing.T, b []byte) {
		for i := 0; i <= len(b); i++ {
			end, ok := openai.ValueEnd(b, i)
			wantEnd, wantOK := refValueEnd(b, i)
			if ok != wantOK || (ok && end != wantEnd) {
				t.Fatalf("ValueEnd(%q, %d) = %d, %v; want %d, %v", b, i, end, ok, wantEnd, wantOK)
			}
		}
		if len(b) > 0 && (b[0] == '[' || b[0] == '{' || b[0] == '"') && json.Valid(b) {
			if end, ok := openai.ValueEnd(b, 0); !ok || end != len(bytes.TrimRight(b, " \t\r\n")) {
				t.Fatalf("ValueEnd(%q, 0) = %d, %v on valid JSON", b, end, ok)
			}
		}
	})
}

// refPositiveInt decodes raw with encoding/json: a positive integral number up to 2^31-1,
// else 0 (FuzzParse's reference for Request.MaxTokens).
func refPositiveInt(raw json.RawMessage) int {
	var x float64
	if json.Unmarshal(raw, &x) != nil || x < 1 || x > math.MaxInt32 || x != math.Trunc(x) {
		return 0
	}
	return int(x)
}
