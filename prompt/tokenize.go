package prompt

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"

	"github.com/kvrouter/kvrouter/openai"
)

// TokenizeLines is `kvrouter tokenize`: it reads JSON lines from in, each a
// /v1/completions body (with "prompt") or a /v1/chat/completions body (with "messages",
// and optionally "tools", "chat_template_kwargs", "add_generation_prompt", ...), and
// writes one line per non-blank input line to out: {"ids":[...]} or {"error":"..."}.
// The ids are those vLLM computes for the request, so the output can be diffed against
// vLLM's /tokenize. It returns only read and write errors.
func TokenizeLines(in io.Reader, out io.Writer, b *Builder) error {
	r := bufio.NewReaderSize(in, 1<<16)
	w := bufio.NewWriter(out)
	for {
		line, readErr := r.ReadBytes('\n')
		if len(bytes.TrimSpace(line)) > 0 {
			var ids []uint32
			req, err := RequestFromBody(line)
			if err == nil {
				ids, err = b.PromptTokens(req)
			}
			if err := writeResult(w, ids, err); err != nil {
				return fmt.Errorf("prompt: write: %w", err)
			}
		}
		if errors.Is(readErr, io.EOF) {
			break
		}
		if readErr != nil {
			return fmt.Errorf("prompt: read: %w", readErr)
		}
	}
	if err := w.Flush(); err != nil {
		return fmt.Errorf("prompt: write: %w", err)
	}
	return nil
}

func writeResult(w *bufio.Writer, ids []uint32, err error) error {
	if err != nil {
		msg, _ := json.Marshal(err.Error())
		w.WriteString(`{"error":`)
		w.Write(msg)
		_, werr := w.WriteString("}\n")
		return werr
	}
	buf := make([]byte, 0, 8+len(ids)*7)
	buf = append(buf, `{"ids":[`...)
	for i, id := range ids {
		if i > 0 {
			buf = append(buf, ',')
		}
		buf = fmt.Appendf(buf, "%d", id)
	}
	buf = append(buf, "]}\n"...)
	_, werr := w.Write(buf)
	return werr
}

// RequestFromBody builds the routing view of a completions or chat completions body
// (chat when it has "messages", completions when it has "prompt"), with vLLM's
// defaults: add_generation_prompt true, add_special_tokens true for completions and
// false for chat.
func RequestFromBody(body []byte) (*openai.Request, error) {
	var top map[string]json.RawMessage
	if err := json.Unmarshal(body, &top); err != nil {
		return nil, fmt.Errorf("%w: body: %w", ErrBadRequest, err)
	}
	req := &openai.Request{AddGenerationPrompt: true}
	switch {
	case present(top, "messages"):
		req.Kind = openai.KindChat
		req.Messages = top["messages"]
	case present(top, "prompt"):
		req.Kind = openai.KindCompletions
		req.Prompt = top["prompt"]
		req.AddSpecialTokens = true
	default:
		return nil, fmt.Errorf("%w: body has neither messages nor prompt", ErrBadRequest)
	}
	req.Tools = nonNull(top["tools"])
	req.ChatTemplateKwargs = nonNull(top["chat_template_kwargs"])
	req.Documents = nonNull(top["documents"])
	for key, dst := range map[string]any{
		"model":                  &req.Model,
		"chat_template":          &req.ChatTemplate,
		"reasoning_effort":       &req.ReasoningEffort,
		"cache_salt":             &req.CacheSalt,
		"add_generation_prompt":  &req.AddGenerationPrompt,
		"continue_final_message": &req.ContinueFinalMessage,
		"add_special_tokens":     &req.AddSpecialTokens,
		"truncate_prompt_tokens": &req.TruncatePromptTokens,
	} {
		if raw := nonNull(top[key]); raw != nil {
			if err := json.Unmarshal(raw, dst); err != nil {
				return nil, fmt.Errorf("%w: %s: %w", ErrBadRequest, key, err)
			}
		}
	}
	return req, nil
}

func present(m map[string]json.RawMessage, key string) bool {
	return nonNull(m[key]) != nil
}

func nonNull(raw json.RawMessage) json.RawMessage {
	t := bytes.TrimSpace(raw)
	if len(t) == 0 || bytes.Equal(t, []byte("null")) {
		return nil
	}
	return raw
}
