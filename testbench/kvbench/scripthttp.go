package kvbench

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"time"
)

// RunScript sends a script to the URL open loop: each session in its own goroutine from
// its start time, its turns in order with their think times. Chat answers are the
// streamed text, sent back as assistant messages. The infinite-cache bound is computed
// for completions (token-id prompts, 16-token blocks); chat leaves it 0 (the client does
// not tokenize).
// A 400 answer counts as rejected (vLLM's answer to a prompt over max_model_len) and
// ends its session.
func (t *HTTPTarget) RunScript(ctx context.Context, s *Script) (ScriptOutput, error) {
	if t.cfg.ResetPrefixCache {
		if err := t.resetAll(ctx); err != nil {
			return ScriptOutput{}, err
		}
	}
	n := s.Requests()
	out := ScriptOutput{Results: make([]Result, n), BoundCached: make([]int, n), Preemptions: -1}
	entries := make([]boundEntry, n)
	t0 := t.now()
	var wg sync.WaitGroup
	seq := 0
	for si := range s.Sessions {
		sess := &s.Sessions[si]
		base := seq
		seq += len(sess.Turns)
		wg.Add(1)
		go func() {
			defer wg.Done()
			answers := make([]string, len(sess.Turns))
			wait := sess.Start - t.now().Sub(t0)
			for k := range sess.Turns {
				if k > 0 {
					wait = sess.Turns[k].Think
				}
				i := base + k
				if !sleepCtx(ctx, wait) {
					for j := k; j < len(sess.Turns); j++ {
						out.Results[base+j] = Result{Seq: base + j, Prefix: si, Err: "not sent"}
					}
					return
				}
				body := s.Body(sess, k, answers, t.cfg.Model, t.cfg.IgnoreEOS)
				res, text := t.post(ctx, s.Path(), body, t0)
				res.Seq, res.Prefix = i, si
				out.Results[i] = res
				if res.Err != "" {
					for j := k + 1; j < len(sess.Turns); j++ {
						out.Results[base+j] = Result{Seq: base + j, Prefix: si, Err: "not sent"}
					}
					return
				}
				answers[k] = text
				if s.API == APICompletions {
					ids := s.PromptIDs(&sess.Turns[k])
					entries[i] = boundEntry{keys: chainKeys(ids, 16), promptLen: len(ids)}
				}
			}
		}()
	}
	wg.Wait()
	if err := ctx.Err(); err != nil {
		return ScriptOutput{}, fmt.Errorf("kvbench: run interrupted: %w", err)
	}
	infiniteBound(&out, entries, 16)
	seen := map[string]bool{}
	for _, r := range out.Results {
		if r.Server != "" && !seen[r.Server] {
			seen[r.Server] = true
			out.Servers = append(out.Servers, r.Server)
		}
	}
	return out, nil
}

// sleepCtx waits d (nothing when d <= 0); false when ctx ended first.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	tm := time.NewTimer(d)
	defer tm.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-tm.C:
		return true
	}
}

// post sends one streaming request and reads its answer.
func (t *HTTPTarget) post(ctx context.Context, path string, body []byte, t0 time.Time) (Result, string) {
	var res Result
	ctx, cancel := context.WithTimeout(ctx, t.cfg.Timeout)
	defer cancel()
	start := t.now()
	res.Start = start.Sub(t0)
	finish := func(err error) Result {
		res.End = t.now().Sub(t0)
		if res.End <= res.Start {
			res.End = res.Start + 1
		}
		if err != nil {
			res.Err = err.Error()
		}
		return res
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.cfg.URL+path, bytes.NewReader(body))
	if err != nil {
		return finish(err), ""
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	resp, err := t.client.Do(req)
	if err != nil {
		return finish(err), ""
	}
	defer resp.Body.Close()
	res.Server = resp.Header.Get(ServedHeader)
	if resp.StatusCode != http.StatusOK {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		res.Rejected = resp.StatusCode == http.StatusBadRequest
		return finish(fmt.Errorf("HTTP %d: %s", resp.StatusCode, strings.TrimSpace(string(msg)))), ""
	}
	st, err := ReadStream(resp.Body, func() { res.TTFT = t.now().Sub(start) })
	if err != nil {
		return finish(err), ""
	}
	res.PromptTokens, res.CachedTokens, res.OutputTokens = st.PromptTokens, st.CachedTokens, st.CompletionTokens
	if res.TTFT == 0 {
		return finish(errors.New("stream carried no token")), ""
	}
	return finish(nil), st.Text
}
