package openai_test

import (
	"encoding/json"
	"testing"

	"github.com/kvrouter/kvrouter/openai"
)

// WithModel replaces the model the router read, and only it: the body parses again to
// the new model with every other field as it was.
func TestWithModel(t *testing.T) {
	for _, tc := range []struct {
		name, path, body, model, want string
	}{
		{name: "chat", path: "/v1/chat/completions", model: "m-v2",
			body: `{"model":"m","messages":[{"role":"user","content":"hi"}]}`,
			want: `{"model":"m-v2","messages":[{"role":"user","content":"hi"}]}`},
		{name: "spaces and escapes", path: "/v1/completions", model: `a"b/<c>`,
			body: "{ \"prompt\": \"x\" ,\n \"model\" :  \"m\\u0031\" , \"stream\": true }",
			want: "{ \"prompt\": \"x\" ,\n \"model\" :  \"a\\\"b/\\u003cc\\u003e\" , \"stream\": true }"},
		{name: "last model wins", path: "/v1/completions", model: "new",
			body: `{"model":"first","prompt":"x","model":"second"}`,
			want: `{"model":"first","prompt":"x","model":"new"}`},
		{name: "longer to shorter", path: "/v1/completions", model: "s",
			body: `{"model":"a-rather-long-model-name","prompt":[1,2,3]}`,
			want: `{"model":"s","prompt":[1,2,3]}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req, err := openai.Parse(tc.path, []byte(tc.body))
			if err != nil {
				t.Fatal(err)
			}
			got := req.WithModel([]byte(tc.body), tc.model)
			if string(got) != tc.want {
				t.Fatalf("WithModel:\n got %s\nwant %s", got, tc.want)
			}
			if n := req.WithModelLen(len(tc.body), tc.model); n != len(got) {
				t.Errorf("WithModelLen = %d, the copy has %d bytes", n, len(got))
			}
			again, err := openai.Parse(tc.path, got)
			if err != nil {
				t.Fatalf("the rewritten body does not parse: %v", err)
			}
			if again.Model != tc.model {
				t.Errorf("model %q, want %q", again.Model, tc.model)
			}
			if !json.Valid(got) {
				t.Error("not JSON")
			}
		})
	}
}
