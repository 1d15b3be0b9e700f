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
	Seed           uint64
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
		cfg.DocumentShare < 0 || cfg.DocumentShare > 1 || cfg.DocumentTokens < 0 {
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
	for len(turns) < cfg.Requests*2 { // enough conversations; the earliest Requests are kept
		t += rng.ExpFloat64() / cfg.SessionsPerSecond
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
			// Keep the previous prompt's full blocks; number the rest afresh.
			keep := length / TraceBlockTokens
			ids = ids[:keep]
			for b := keep; b < (context+TraceBlockTokens-1)/TraceBlockTokens; b++ {
				ids = append(ids, nextID)
				nextID++
			}
			out := between(cfg.OutputTokens)
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
