package openai

import (
	"bytes"
	"encoding/json"
)

// DefaultUsageBufferBytes bounds what a UsageReader holds: one SSE event, or a whole
// non-streamed JSON body. Longer events or bodies are skipped, not failed.
const DefaultUsageBufferBytes = 1 << 20

// Usage is the part of a response's usage object the router counts.
type Usage struct {
	PromptTokens int
	// CompletionTokens is usage.completion_tokens: the tokens the response generated.
	CompletionTokens int
	// CachedTokens is usage.prompt_tokens_details.cached_tokens; HasCached says whether
	// the response reported it (vLLM does when prompt-token details are enabled).
	CachedTokens int
	HasCached    bool
}

// UsageReader finds usage in a response body fed to it in chunks, as they arrive: either
// a Server-Sent-Events stream (usage in a "data:" event, events possibly split across
// chunks) or one plain JSON body. The zero value is ready to use with the default limit.
// A UsageReader is not safe for concurrent use; it never changes the bytes it is given.
type UsageReader struct {
	// MaxBytes bounds the buffered event or body; 0 means DefaultUsageBufferBytes.
	MaxBytes int

	started  bool
	sse      bool
	overflow bool // the current line (SSE) or body (JSON) outgrew MaxBytes
	buf      []byte
	data     []byte // data lines of the SSE event being assembled
	usage    Usage
	found    bool
}

func (u *UsageReader) limit() int {
	if u.MaxBytes > 0 {
		return u.MaxBytes
	}
	return DefaultUsageBufferBytes
}

// Write feeds the next chunk of the body. It always accepts the whole chunk.
func (u *UsageReader) Write(p []byte) (int, error) {
	n := len(p)
	if !u.started {
		p = bytes.TrimLeft(p, " \t\r\n")
		if len(p) == 0 {
			return n, nil
		}
		u.started = true
		u.sse = p[0] != '{'
	}
	if !u.sse {
		if !u.overflow {
			if len(u.buf)+len(p) > u.limit() {
				u.overflow, u.buf = true, nil
			} else {
				u.buf = append(u.buf, p...)
			}
		}
		return n, nil
	}
	for len(p) > 0 {
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			u.appendLine(p)
			break
		}
		u.appendLine(p[:i])
		u.endLine()
		p = p[i+1:]
	}
	return n, nil
}

func (u *UsageReader) appendLine(p []byte) {
	if u.overflow {
		return
	}
	if len(u.buf)+len(p) > u.limit() {
		u.overflow, u.buf = true, u.buf[:0]
		return
	}
	u.buf = append(u.buf, p...)
}

// endLine handles one complete SSE line (without its '\n').
func (u *UsageReader) endLine() {
	line := bytes.TrimSuffix(u.buf, []byte("\r"))
	skip := u.overflow
	u.overflow = false
	defer func() { u.buf = u.buf[:0] }()
	if skip {
		u.data = u.data[:0]
		return
	}
	if len(line) == 0 { // blank line: dispatch the event
		u.dispatch()
		return
	}
	if v, ok := bytes.CutPrefix(line, []byte("data:")); ok {
		v = bytes.TrimPrefix(v, []byte(" "))
		if len(u.data) > 0 {
			u.data = append(u.data, '\n')
		}
		if len(u.data)+len(v) <= u.limit() {
			u.data = append(u.data, v...)
		}
	}
	// Other fields (event:, id:, retry:, comments) carry no usage.
}

func (u *UsageReader) dispatch() {
	if len(u.data) > 0 {
		u.scan(u.data)
	}
	u.data = u.data[:0]
}

// scan reads usage from one JSON document, if it has a non-null usage object.
func (u *UsageReader) scan(doc []byte) {
	if !bytes.Contains(doc, []byte(`"usage"`)) {
		return
	}
	var v struct {
		Usage *struct {
			PromptTokens        int `json:"prompt_tokens"`
			CompletionTokens    int `json:"completion_tokens"`
			PromptTokensDetails *struct {
				CachedTokens *int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	if json.Unmarshal(doc, &v) != nil || v.Usage == nil {
		return
	}
	got := Usage{PromptTokens: v.Usage.PromptTokens, CompletionTokens: v.Usage.CompletionTokens}
	if d := v.Usage.PromptTokensDetails; d != nil && d.CachedTokens != nil {
		got.CachedTokens, got.HasCached = *d.CachedTokens, true
	}
	u.usage, u.found = got, true
}

// Finish ends the body and returns the last usage seen; ok is false when the body held
// none (a stream without stream_options.include_usage, say).
func (u *UsageReader) Finish() (usage Usage, ok bool) {
	if u.sse {
		if len(u.buf) > 0 || u.overflow {
			u.endLine()
		}
		u.dispatch()
	} else if u.started && !u.overflow {
		u.scan(u.buf)
		u.buf = nil
	}
	return u.usage, u.found
}
