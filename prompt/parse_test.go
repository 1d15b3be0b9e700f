package prompt_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/kvrouter/kvrouter/openai"
	"github.com/kvrouter/kvrouter/prompt"
)

// Two messages the message cache holds once validMessagesBody was computed, so that
// bodies re-sending their bytes are checked by comparison with them, not decoded.
const (
	cachedUser      = `{"role":"user","content":"What is a KV cache?\nBe brief."}`
	cachedAssistant = `{"role":"assistant","content":"Memory of a sequence's attention keys and values."}`
)

func chatBody(messages string) []byte {
	return []byte(`{"model":"qwen3","messages":` + messages + `,"stream":true}`)
}

// validMessagesBody is a conversation whose messages the cases below re-send.
var validMessagesBody = chatBody("[" + cachedUser + "," + cachedAssistant + "]")

// invalidMessages are messages lists openai.Parse delimits but does not validate,
// each invalid only where the chat template must find it: in a message it decodes,
// between messages, or in bytes that extend or alter a message it holds.
var invalidMessages = []struct{ name, messages string }{
	{"invalid UTF-8 in a new message", "[" + cachedUser + "," + cachedAssistant + `,{"role":"user","content":"a` + "\xff" + `"}]`},
	{"invalid UTF-8 in a held message", "[" + strings.Replace(cachedUser, "KV", "K\xff", 1) + "," + cachedAssistant + "]"},
	{"control character", "[" + cachedUser + `,{"role":"user","content":"a` + "\x01" + `"}]`},
	{"bad escape", "[" + cachedUser + `,{"role":"user","content":"a\x"}]`},
	{"bad literal", "[" + cachedUser + `,{"role":"user","content":nul}]`},
	{"bad number", "[" + cachedUser + `,{"role":"user","content":"a","n":01}]`},
	{"missing colon", "[" + cachedUser + `,{"role" "user"}]`},
	{"bytes after a held message", "[" + cachedUser + "x," + cachedAssistant + "]"},
	{"bad member added to a held message", "[" + cachedUser[:len(cachedUser)-1] + `,"n":01},` + cachedAssistant + "]"},
	{"no comma between held messages", "[" + cachedUser + " " + cachedAssistant + "]"},
	{"trailing comma", "[" + cachedUser + "," + cachedAssistant + ",]"},
	{"leading comma", "[," + cachedUser + "]"},
	{"mismatched brackets", "[" + cachedUser + `,{"role":"user","content":["a"}]]`},
	{"bare word", "[" + cachedUser + ",user]"},
}

// TestParsedMessagesValidated: openai.Parse leaves a chat body's messages to the chat
// template to validate (it only delimits them); a body whose messages are not valid
// JSON must then fail in PromptTokens as a bad request, with the message cache holding
// the messages it re-sends (checked by byte comparison) and without it (decoded).
func TestParsedMessagesValidated(t *testing.T) {
	for _, b := range []struct {
		name string
		b    *prompt.Builder
	}{{"message cache", builder(t, "qwen3", nil)}, {"no cache", plainBuilder(t, "qwen3")}} {
		t.Run(b.name, func(t *testing.T) {
			req, err := openai.Parse(openai.PathChatCompletions, validMessagesBody)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := b.b.PromptTokens(req); err != nil { // the held messages
				t.Fatal(err)
			}
			for _, tc := range invalidMessages {
				t.Run(tc.name, func(t *testing.T) {
					body := chatBody(tc.messages)
					if json.Valid(body) && utf8.Valid(body) {
						t.Fatalf("the case is valid JSON: %q", body)
					}
					req, err := openai.Parse(openai.PathChatCompletions, body)
					if err != nil {
						t.Fatalf("Parse: %v (the messages are the template's to validate)", err)
					}
					ids, err := b.b.PromptTokens(req)
					if !errors.Is(err, prompt.ErrBadRequest) {
						t.Fatalf("PromptTokens = %d ids, %v; want ErrBadRequest", len(ids), err)
					}
				})
			}
		})
	}
}

// FuzzParsedMessages: a chat body that openai.Parse and PromptTokens both accept is
// valid JSON and UTF-8, whatever its messages hold and whichever of them the message
// cache holds (it is warmed by the seed conversation).
func FuzzParsedMessages(f *testing.F) {
	f.Add(validMessagesBody)
	for _, tc := range invalidMessages {
		f.Add(chatBody(tc.messages))
	}
	b := builder(f, "qwen3", nil)
	req, err := openai.Parse(openai.PathChatCompletions, validMessagesBody)
	if err != nil {
		f.Fatal(err)
	}
	if _, err := b.PromptTokens(req); err != nil {
		f.Fatal(err)
	}
	f.Fuzz(func(t *testing.T, body []byte) {
		req, err := openai.Parse(openai.PathChatCompletions, body)
		if err != nil {
			return
		}
		orig := bytes.Clone(body)
		if _, err := b.PromptTokens(req); err != nil {
			return
		}
		if !bytes.Equal(body, orig) {
			t.Fatal("body modified")
		}
		if !utf8.Valid(body) || !json.Valid(body) {
			t.Fatalf("accepted an invalid body: %q", body)
		}
	})
}
