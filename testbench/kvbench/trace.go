package kvbench

import (
	"bufio"
	"bytes"
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"slices"
)

// TraceBlockTokens is the Mooncake trace format's block: each hash id stands for 512
// prompt tokens, and identical hash ids mean identical prefix content (ids are chained:
// an id also fixes every block before it).
const TraceBlockTokens = 512

// maxTraceLine bounds one line of a trace file: a 1M-token request has 2,048 hash ids,
// well under 64 KiB; 1 MiB leaves room for other fields and stops a runaway line.
const maxTraceLine = 1 << 20

// TraceRecord is one request of a Mooncake-format trace (kvcache-ai/Mooncake,
// FAST25-release): a JSON line of timestamp (ms since the trace's start), input_length and
// output_length (tokens) and hash_ids (one per 512-token prompt block, the last block cut
// to input_length). Other fields are ignored.
type TraceRecord struct {
	Timestamp    float64 `json:"timestamp"`
	InputLength  int     `json:"input_length"`
	OutputLength int     `json:"output_length"`
	HashIDs      []int64 `json:"hash_ids"`
}

// TraceError reports the first invalid line of a trace.
type TraceError struct {
	Line int
	Err  error
}

func (e *TraceError) Error() string { return fmt.Sprintf("kvbench: trace line %d: %v", e.Line, e.Err) }
func (e *TraceError) Unwrap() error { return e.Err }

// Validate checks one record on its own: positive lengths, one hash id per 512-token
// block of the input, non-negative ids and a finite non-negative timestamp.
func (r *TraceRecord) Validate() error {
	switch {
	case math.IsNaN(r.Timestamp) || math.IsInf(r.Timestamp, 0) || r.Timestamp < 0:
		return fmt.Errorf("timestamp %v must be a non-negative number of milliseconds", r.Timestamp)
	case r.InputLength < 1:
		return fmt.Errorf("input_length %d must be at least 1", r.InputLength)
	case r.OutputLength < 1:
		return fmt.Errorf("output_length %d must be at least 1", r.OutputLength)
	case len(r.HashIDs) != (r.InputLength+TraceBlockTokens-1)/TraceBlockTokens:
		return fmt.Errorf("%d hash_ids for input_length %d: want one per %d tokens (%d)",
			len(r.HashIDs), r.InputLength, TraceBlockTokens, (r.InputLength+TraceBlockTokens-1)/TraceBlockTokens)
	}
	for _, h := range r.HashIDs {
		if h < 0 {
			return fmt.Errorf("hash id %d is negative", h)
		}
	}
	return nil
}

// DecodeTrace reads a Mooncake-format trace: one JSON object per line, blank lines
// skipped, timestamps non-decreasing (the trace's order is its arrival order). limit > 0
// stops after that many records. The first bad line is a *TraceError.
func DecodeTrace(r io.Reader, limit int) ([]TraceRecord, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxTraceLine)
	var out []TraceRecord
	line := 0
	last := 0.0
	for sc.Scan() {
		line++
		b := bytes.TrimSpace(sc.Bytes())
		if len(b) == 0 {
			continue
		}
		var rec TraceRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, &TraceError{Line: line, Err: err}
		}
		if err := rec.Validate(); err != nil {
			return nil, &TraceError{Line: line, Err: err}
		}
		if rec.Timestamp < last {
			return nil, &TraceError{Line: line, Err: fmt.Errorf("timestamp %v goes back from %v", rec.Timestamp, last)}
		}
		last = rec.Timestamp
		out = append(out, rec)
		if limit > 0 && len(out) >= limit {
			return out, nil
		}
	}
	if err := sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return nil, &TraceError{Line: line + 1, Err: fmt.Errorf("line longer than %d bytes", maxTraceLine)}
		}
		return nil, fmt.Errorf("kvbench: reading trace: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("kvbench: the trace has no records")
	}
	return out, nil
}

// WriteTrace writes records as Mooncake JSON lines.
func WriteTrace(w io.Writer, recs []TraceRecord) error {
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for i := range recs {
		if err := enc.Encode(&recs[i]); err != nil {
			return fmt.Errorf("kvbench: writing trace: %w", err)
		}
	}
	if err := bw.Flush(); err != nil {
		return fmt.Errorf("kvbench: writing trace: %w", err)
	}
	return nil
}

// TraceTokens builds a record's prompt: each hash id's 512 tokens drawn from vocab with a
// generator seeded by the id alone (same id, same tokens, in any request and any run), the
// last block cut to input_length.
func TraceTokens(rec *TraceRecord, vocab []uint32) []uint32 {
	out := make([]uint32, 0, rec.InputLength)
	for _, h := range rec.HashIDs {
		rng := rand.New(rand.NewPCG(uint64(h), 0x6d6f6f6e63616b65)) // "mooncake"
		for range min(TraceBlockTokens, rec.InputLength-len(out)) {
			out = append(out, vocab[rng.IntN(len(vocab))])
		}
	}
	return out
}

// TraceBound is the cached-token ratio an infinite prefix cache of blockSize-token blocks
// reaches on the trace in its own order, counting only requests of at most maxLen prompt
// + output tokens (longer ones are rejected before any cache sees them; 0 = no limit):
// each request hits the leading full blocks that an earlier request computed (prompt
// blocks only: outputs are never re-sent in a trace), never its last token (vLLM
// recomputes it).
func TraceBound(recs []TraceRecord, blockSize, maxLen int) float64 {
	type key struct {
		id  int64
		sub int
	}
	seen := map[key]bool{}
	var hits, total int
	perBlock := TraceBlockTokens / blockSize
	for i := range recs {
		r := &recs[i]
		if maxLen > 0 && r.InputLength+r.OutputLength > maxLen {
			continue
		}
		total += r.InputLength
		full := r.InputLength / blockSize
		hitable := (r.InputLength - 1) / blockSize
		counting := true
		for b := 0; b < full; b++ {
			// A 16-token block inside hash id h at sub-position s: its content and its
			// whole prefix are fixed by h (chained ids) and s.
			k := key{id: r.HashIDs[b/perBlock], sub: b % perBlock}
			if counting && b < hitable && seen[k] {
				hits += blockSize
			} else {
				counting = false
			}
			seen[k] = true
		}
	}
	if total == 0 {
		return 0
	}
	return float64(hits) / float64(total)
}

// TraceGenConfig shapes a synthetic Mooncake-format trace of conversations, for tests and
// measurements (no third-party trace is needed or committed).
type TraceGenConfig struct {
	// Requests is how many records to write.
	Requests int
	// SessionsPerSecond is the Poisson arrival rate of new conversations.
	SessionsPerSecond float64
	// SystemPrompts are shared system prompts of SystemBlocks 512-token blocks each,
	// drawn Zipf(1) by each conversation.
	SystemPrompts, SystemBlocks int
	// MeanTurns is the mean of a conversation's geometric number of turns.
	MeanTurns float64
	// UserTokens is the range of a turn's new user tokens; OutputTokens the range of its
	// output length.
	UserTokens, OutputTokens [2]int
	// ThinkSeconds is the mean of the exponential pause between a turn and the next.
	ThinkSeconds float64
	// DocumentShare of conversations start with a DocumentTokens-token document (a
	// long-context session; with enough turns it outgrows a 40,960-token model).
	DocumentShare  float64
	DocumentTokens int
	// OneShotShare of sessions are one request of OneShotTokens prompt tokens that shares
	// nothing (no system prompt, every block new): traffic with no reuse.
	OneShotShare  float64
	OneShotTokens [2]int
	// MaxTokens ends a conversation before a turn whose prompt + output would pass it, as a
	// client does at the model's context (0 = no limit: longer turns are written and a
	// replay's server rejects them).
	MaxTokens int
	Seed      uint64
}

// TraceShape names a preset of the trace generator (kvbench --gen-trace-shape).
type TraceShape string

// The generator's shapes. Every shape is a TraceGenConfig; TraceShapeConfig returns it.
const (
	// TraceShapeDefault is DefaultTraceGenConfig, the shape of every committed trace.
	TraceShapeDefault TraceShape = "default"
	// TraceShapeConversation is shaped like Mooncake's conversation trace (mean input about
	// 12k tokens, mean output about 343).
	TraceShapeConversation TraceShape = "conversation"
	// TraceShapeToolAgent is shaped like a tool/agent trace: sessions on a few long shared
	// tool-definition prefixes, many short appended steps, short outputs, one-shot requests
	// mixed in.
	TraceShapeToolAgent TraceShape = "toolagent"
)

// TraceShapes lists the generator's shapes, the default first.
func TraceShapes() []TraceShape {
	return []TraceShape{TraceShapeDefault, TraceShapeConversation, TraceShapeToolAgent}
}

// TraceShapeConfig is the generator's config for a shape; an unknown shape is an error
// naming the known ones. The shapes other than the default end conversations at the
// simulated model's max_model_len (DefaultSimConfig), so a replay at the defaults serves
// every request; the default keeps no limit so its committed traces reproduce.
func TraceShapeConfig(s TraceShape) (TraceGenConfig, error) {
	c := DefaultTraceGenConfig()
	switch s {
	case TraceShapeDefault:
		return c, nil
	case TraceShapeConversation:
		// Mooncake's conversation trace: mean input 12,035 and output 343 tokens. Longer
		// system prompts (16 of 2,048 tokens), longer user turns and more of them, a fifth
		// of the conversations over a 16k-token document, and 3 sessions in 10 one-shot
		// (about 8% of the requests). 300 requests: mean input 10.5k to 11.9k, output
		// about 335 (seeds 1 to 3).
		c.SessionsPerSecond = 0.25
		c.SystemPrompts, c.SystemBlocks = 16, 4
		c.MeanTurns = 5
		c.UserTokens, c.OutputTokens = [2]int{200, 3000}, [2]int{50, 636}
		c.ThinkSeconds = 30
		c.DocumentShare, c.DocumentTokens = 0.2, 16384
		c.OneShotShare, c.OneShotTokens = 0.3, [2]int{500, 8000}
	case TraceShapeToolAgent:
		// Agents: 4 tool-definition sets of 6,144 tokens, 8 steps a session on average,
		// each appending a short tool result (20 to 400 tokens) a second or two after the
		// last, outputs of 60 to 300 tokens (mean 180); 6 sessions in 10 one-shot (about
		// 16% of the requests). 300 requests: mean input about 7k.
		c.SessionsPerSecond = 0.5
		c.SystemPrompts, c.SystemBlocks = 4, 12
		c.MeanTurns = 8
		c.UserTokens, c.OutputTokens = [2]int{20, 400}, [2]int{60, 300}
		c.ThinkSeconds = 2
		c.DocumentShare, c.DocumentTokens = 0, 0
		c.OneShotShare, c.OneShotTokens = 0.6, [2]int{200, 4000}
	default:
		return TraceGenConfig{}, fmt.Errorf("kvbench: unknown trace shape %q (want one of %v)", s, TraceShapes())
	}
	c.MaxTokens = DefaultSimConfig().Engine.MaxModelLen
	return c, nil
}

// DefaultTraceGenConfig is a small conversation trace: about 3 minutes of 400 requests,
// 8 system prompts of 1,024 tokens, 4 turns per conversation on average, 5% of them
// over a 32,768-token document (some outgrow a 40,960-token model), mean input around 5k tokens.
func DefaultTraceGenConfig() TraceGenConfig {
	return TraceGenConfig{
		Requests: 400, SessionsPerSecond: 0.6, SystemPrompts: 8, SystemBlocks: 2,
		MeanTurns: 4, UserTokens: [2]int{100, 1500}, OutputTokens: [2]int{50, 400},
		ThinkSeconds: 20, DocumentShare: 0.05, DocumentTokens: 32768, Seed: 1,
	}
}

// GenerateTrace builds a deterministic trace from cfg: the same config gives the same
// bytes. Each turn's prompt is the conversation so far (system prompt, document, earlier
// user messages and outputs) plus a new user message; its hash ids repeat the previous
// turn's full blocks and number every new block afresh, as Mooncake's chained ids do.
func GenerateTrace(cfg TraceGenConfig) ([]TraceRecord, error) {
	if cfg.Requests < 1 || cfg.SessionsPerSecond <= 0 || cfg.MeanTurns < 1 || cfg.SystemPrompts < 0 ||
		cfg.SystemBlocks < 0 || cfg.UserTokens[0] < 1 || cfg.UserTokens[1] < cfg.UserTokens[0] ||
		cfg.OutputTokens[0] < 1 || cfg.OutputTokens[1] < cfg.OutputTokens[0] || cfg.ThinkSeconds < 0 ||
		cfg.DocumentShare < 0 || cfg.DocumentShare > 1 || cfg.DocumentTokens < 0 ||
		cfg.OneShotShare < 0 || cfg.OneShotShare > 1 || cfg.MaxTokens < 0 ||
		(cfg.OneShotShare > 0 && (cfg.OneShotTokens[0] < 1 || cfg.OneShotTokens[1] < cfg.OneShotTokens[0])) {
		return nil, fmt.Errorf("kvbench: invalid trace generator config %+v", cfg)
	}
	rng := rand.New(rand.NewPCG(cfg.Seed, 0x7472616365)) // "trace"
	nextID := int64(cfg.SystemPrompts * cfg.SystemBlocks)
	pickSystem := prefixPicker(max(cfg.SystemPrompts, 1), 1)
	between := func(r [2]int) int { return r[0] + rng.IntN(r[1]-r[0]+1) }
	type turn struct {
		at  float64 // seconds
		rec TraceRecord
	}
	var turns []turn
	t := 0.0
	// A MaxTokens below every session's first request would loop for ever: give up after
	// far more sessions than the trace needs.
	for sessions := 0; len(turns) < cfg.Requests*2; sessions++ { // enough sessions; the earliest Requests are kept
		if sessions > 100*cfg.Requests {
			return nil, fmt.Errorf("kvbench: trace generator: max tokens %d admits %d requests of %d sessions", cfg.MaxTokens, len(turns), sessions)
		}
		t += rng.ExpFloat64() / cfg.SessionsPerSecond
		if cfg.OneShotShare > 0 && rng.Float64() < cfg.OneShotShare {
			in, out := between(cfg.OneShotTokens), between(cfg.OutputTokens)
			if cfg.MaxTokens > 0 && in+out > cfg.MaxTokens {
				continue
			}
			ids := make([]int64, (in+TraceBlockTokens-1)/TraceBlockTokens)
			for b := range ids {
				ids[b] = nextID
				nextID++
			}
			turns = append(turns, turn{at: t, rec: TraceRecord{InputLength: in, OutputLength: out, HashIDs: ids}})
			continue
		}
		var ids []int64
		length := 0
		if cfg.SystemPrompts > 0 && cfg.SystemBlocks > 0 {
			s := pickSystem(rng)
			for b := range cfg.SystemBlocks {
				ids = append(ids, int64(s*cfg.SystemBlocks+b))
			}
			length = cfg.SystemBlocks * TraceBlockTokens
		}
		context := length
		if rng.Float64() < cfg.DocumentShare {
			context += cfg.DocumentTokens
		}
		n := 1 + int(rng.ExpFloat64()*(cfg.MeanTurns-1)+0.5)
		at := t
		for k := 0; k < n; k++ {
			context += between(cfg.UserTokens)
			out := between(cfg.OutputTokens)
			if cfg.MaxTokens > 0 && context+out > cfg.MaxTokens {
				break // the client starts over rather than pass the model's context
			}
			// Keep the previous prompt's full blocks; number the rest afresh.
			keep := length / TraceBlockTokens
			ids = ids[:keep]
			for b := keep; b < (context+TraceBlockTokens-1)/TraceBlockTokens; b++ {
				ids = append(ids, nextID)
				nextID++
			}
			turns = append(turns, turn{at: at, rec: TraceRecord{InputLength: context, OutputLength: out, HashIDs: append([]int64(nil), ids...)}})
			length = context
			context += out
			at += rng.ExpFloat64()*cfg.ThinkSeconds + 1
		}
	}
	// Arrival order; ties keep generation order.
	slices.SortStableFunc(turns, func(a, b turn) int { return cmp.Compare(a.at, b.at) })
	out := make([]TraceRecord, cfg.Requests)
	for i := range out {
		out[i] = turns[i].rec
		out[i].Timestamp = math.Round(turns[i].at * 1000)
	}
	return out, nil
}
