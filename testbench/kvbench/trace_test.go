package kvbench

import (
	"bytes"
	"context"
	"errors"
	"os"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestDecodeTrace(t *testing.T) {
	ok := `{"timestamp":0,"input_length":600,"output_length":10,"hash_ids":[1,2]}

{"timestamp":5,"input_length":512,"output_length":1,"hash_ids":[1],"extra":"ignored"}
{"timestamp":5,"input_length":1,"output_length":3,"hash_ids":[9]}
`
	recs, err := DecodeTrace(strings.NewReader(ok), 0)
	if err != nil {
		t.Fatal(err)
	}
	if len(recs) != 3 || recs[0].InputLength != 600 || !slices.Equal(recs[0].HashIDs, []int64{1, 2}) || recs[1].Timestamp != 5 {
		t.Fatalf("decoded %+v", recs)
	}
	if recs, err := DecodeTrace(strings.NewReader(ok), 2); err != nil || len(recs) != 2 {
		t.Fatalf("limit 2: %d records, %v", len(recs), err)
	}
	for _, tc := range []struct{ name, in, want string }{
		{"empty", "\n\n", "no records"},
		{"not json", "{", "line 1"},
		{"too few hash ids", `{"timestamp":0,"input_length":513,"output_length":1,"hash_ids":[1]}`, "want one per 512 tokens (2)"},
		{"too many hash ids", `{"timestamp":0,"input_length":10,"output_length":1,"hash_ids":[1,2]}`, "want one per 512 tokens (1)"},
		{"no input", `{"timestamp":0,"input_length":0,"output_length":1,"hash_ids":[]}`, "input_length 0"},
		{"no output", `{"timestamp":0,"input_length":1,"output_length":0,"hash_ids":[1]}`, "output_length 0"},
		{"negative id", `{"timestamp":0,"input_length":1,"output_length":1,"hash_ids":[-1]}`, "negative"},
		{"negative time", `{"timestamp":-1,"input_length":1,"output_length":1,"hash_ids":[1]}`, "timestamp"},
		{"time goes back", "{\"timestamp\":9,\"input_length\":1,\"output_length\":1,\"hash_ids\":[1]}\n{\"timestamp\":8,\"input_length\":1,\"output_length\":1,\"hash_ids\":[1]}", "line 2: timestamp 8 goes back"},
		{"line too long", `{"timestamp":0,"hash_ids":[` + strings.Repeat("1,", maxTraceLine/2) + `1]}`, "longer than"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := DecodeTrace(strings.NewReader(tc.in), 0)
			if err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("error %v, want it to mention %q", err, tc.want)
			}
		})
	}
	var te *TraceError
	if _, err := DecodeTrace(strings.NewReader("{}"), 0); !errors.As(err, &te) || te.Line != 1 {
		t.Fatalf("error %v is not a *TraceError at line 1", err)
	}
}

func FuzzDecodeTrace(f *testing.F) {
	f.Add([]byte(`{"timestamp":0,"input_length":600,"output_length":10,"hash_ids":[1,2]}`))
	f.Add([]byte("{\"timestamp\":1.5,\"input_length\":1,\"output_length\":1,\"hash_ids\":[0]}\n\n{}"))
	f.Add([]byte(`{"timestamp":1e308,"input_length":1e3,"output_length":1,"hash_ids":[1,2]}`))
	f.Fuzz(func(t *testing.T, b []byte) {
		recs, err := DecodeTrace(bytes.NewReader(b), 0)
		if err != nil {
			return
		}
		// Whatever decodes is valid, and survives a round trip unchanged.
		for i := range recs {
			if err := recs[i].Validate(); err != nil {
				t.Fatalf("record %d decoded but invalid: %v", i, err)
			}
		}
		var buf bytes.Buffer
		if err := WriteTrace(&buf, recs); err != nil {
			t.Fatal(err)
		}
		again, err := DecodeTrace(&buf, 0)
		if err != nil || len(again) != len(recs) {
			t.Fatalf("round trip: %d of %d records, %v", len(again), len(recs), err)
		}
		for i := range recs {
			if again[i].Timestamp != recs[i].Timestamp || !slices.Equal(again[i].HashIDs, recs[i].HashIDs) {
				t.Fatalf("record %d changed in a round trip: %+v -> %+v", i, recs[i], again[i])
			}
		}
	})
}

// generatedTrace generates the trace c describes and writes it as a trace file.
func generatedTrace(t *testing.T, c TraceGenConfig) ([]TraceRecord, *bytes.Buffer) {
	t.Helper()
	recs, err := GenerateTrace(c)
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	if err := WriteTrace(&buf, recs); err != nil {
		t.Fatal(err)
	}
	return recs, &buf
}

// The committed test trace is exactly what the generator writes (kvbench --gen-trace
// kvbench/testdata/trace-small.jsonl --trace-requests 200).
func TestGeneratedTraceIsCommitted(t *testing.T) {
	c := DefaultTraceGenConfig()
	c.Requests = 200
	_, buf := generatedTrace(t, c)
	want, err := os.ReadFile("testdata/trace-small.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), want) {
		t.Fatal("testdata/trace-small.jsonl differs from the generator's output: regenerate it with kvbench --gen-trace")
	}
	if _, err := DecodeTrace(bytes.NewReader(want), 0); err != nil {
		t.Fatalf("the generated trace does not decode: %v", err)
	}
}

// Each shape writes a valid trace of its documented shape: every request within its
// MaxTokens, the means the shape names, the sharing it describes.
func TestTraceShapes(t *testing.T) {
	type stats struct {
		meanIn, meanOut float64
		oneShot         int // requests whose first block no other request has
		sharedFirst     int // distinct first blocks shared by several requests
	}
	measure := func(recs []TraceRecord) stats {
		var st stats
		first := map[int64]int{}
		for _, r := range recs {
			st.meanIn += float64(r.InputLength) / float64(len(recs))
			st.meanOut += float64(r.OutputLength) / float64(len(recs))
			first[r.HashIDs[0]]++
		}
		for _, n := range first {
			if n == 1 {
				st.oneShot++
			} else {
				st.sharedFirst++
			}
		}
		return st
	}
	for _, tc := range []struct {
		shape          TraceShape
		in, out        [2]float64 // bounds of the mean input and output lengths
		oneShot        [2]int     // bounds of the requests sharing no first block
		maxSharedFirst int        // most distinct shared first blocks (the system prompts)
	}{
		{TraceShapeDefault, [2]float64{4000, 6000}, [2]float64{200, 250}, [2]int{0, 20}, 8},
		{TraceShapeConversation, [2]float64{10000, 14000}, [2]float64{300, 390}, [2]int{20, 60}, 16},
		{TraceShapeToolAgent, [2]float64{6000, 9000}, [2]float64{160, 200}, [2]int{20, 60}, 4},
	} {
		t.Run(string(tc.shape), func(t *testing.T) {
			c, err := TraceShapeConfig(tc.shape)
			if err != nil {
				t.Fatal(err)
			}
			c.Requests = 300
			recs, buf := generatedTrace(t, c)
			if _, err := DecodeTrace(buf, 0); err != nil {
				t.Fatalf("the generated trace does not decode: %v", err)
			}
			if tc.shape != TraceShapeDefault {
				if c.MaxTokens != DefaultSimConfig().Engine.MaxModelLen {
					t.Errorf("MaxTokens %d, want the simulated model's max_model_len %d", c.MaxTokens, DefaultSimConfig().Engine.MaxModelLen)
				}
				for i, r := range recs {
					if r.InputLength+r.OutputLength > c.MaxTokens {
						t.Errorf("request %d: %d + %d tokens, over MaxTokens %d", i, r.InputLength, r.OutputLength, c.MaxTokens)
					}
				}
			}
			st := measure(recs)
			if st.meanIn < tc.in[0] || st.meanIn > tc.in[1] || st.meanOut < tc.out[0] || st.meanOut > tc.out[1] {
				t.Errorf("mean input %.0f (want %v), output %.0f (want %v)", st.meanIn, tc.in, st.meanOut, tc.out)
			}
			if st.oneShot < tc.oneShot[0] || st.oneShot > tc.oneShot[1] || st.sharedFirst > tc.maxSharedFirst {
				t.Errorf("%d requests share no first block (want %v), %d shared first blocks (want at most %d)",
					st.oneShot, tc.oneShot, st.sharedFirst, tc.maxSharedFirst)
			}
		})
	}
	if _, err := TraceShapeConfig("chats"); err == nil || !strings.Contains(err.Error(), "toolagent") {
		t.Errorf("unknown shape: %v, want an error naming the shapes", err)
	}
}

// MaxTokens ends a conversation before a turn that would pass it; a limit no session's
// first request fits is an error, not an endless loop; bad one-shot ranges are refused.
func TestGenerateTraceLimits(t *testing.T) {
	c := DefaultTraceGenConfig()
	c.Requests, c.Seed = 600, 2
	over := func(recs []TraceRecord, limit int) int {
		n := 0
		for _, r := range recs {
			if r.InputLength+r.OutputLength > limit {
				n++
			}
		}
		return n
	}
	recs, err := GenerateTrace(c)
	if err != nil {
		t.Fatal(err)
	}
	if over(recs, 40960) == 0 {
		t.Fatal("no request of the unlimited trace passes 40,960 tokens: the limit below tests nothing")
	}
	c.MaxTokens = 40960
	if recs, err = GenerateTrace(c); err != nil {
		t.Fatal(err)
	}
	if n := over(recs, c.MaxTokens); n > 0 || len(recs) != c.Requests {
		t.Errorf("with MaxTokens %d: %d of %d requests over it", c.MaxTokens, n, len(recs))
	}
	c.MaxTokens = 1000 // below the 1,024-token system prompt of every conversation
	if _, err := GenerateTrace(c); err == nil {
		t.Error("MaxTokens below every first request: no error")
	}
	c = DefaultTraceGenConfig()
	c.OneShotShare, c.OneShotTokens = 0.5, [2]int{100, 50}
	if _, err := GenerateTrace(c); err == nil {
		t.Error("one-shot range 100..50: no error")
	}
}

func TestTraceTokens(t *testing.T) {
	vocab := []uint32{10, 11, 12, 13, 14, 15, 16, 17}
	a := TraceTokens(&TraceRecord{InputLength: 1000, HashIDs: []int64{7, 8}}, vocab)
	b := TraceTokens(&TraceRecord{InputLength: 700, HashIDs: []int64{7, 9}}, vocab)
	if len(a) != 1000 || len(b) != 700 {
		t.Fatalf("lengths %d and %d, want the input lengths", len(a), len(b))
	}
	if !slices.Equal(a[:512], b[:512]) {
		t.Fatal("the same hash id made different tokens")
	}
	if slices.Equal(a[512:700], b[512:700]) {
		t.Fatal("different hash ids made the same tokens")
	}
	c := TraceTokens(&TraceRecord{InputLength: 600, HashIDs: []int64{7, 8}}, vocab)
	if !slices.Equal(c, a[:600]) {
		t.Fatal("a shorter cut of the same ids is not a prefix")
	}
}

func smallTrace(t *testing.T) []TraceRecord {
	t.Helper()
	f, err := os.Open("testdata/trace-small.jsonl")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	recs, err := DecodeTrace(f, 0)
	if err != nil {
		t.Fatal(err)
	}
	return recs
}

// Replaying the committed trace in the simulator: arrivals at timestamp/speedup, requests
// over max_model_len rejected (and counted, not failed), the in-run bound equal to the
// trace's own infinite-cache bound, and no policy above it.
func TestTraceReplaySim(t *testing.T) {
	recs := smallTrace(t)[:120]
	const speedup, maxLen = 4, 8192
	s, err := NewTraceScript(recs, speedup, nil)
	if err != nil {
		t.Fatal(err)
	}
	tf := &testFleet{}
	cfg := smallSim(tf)
	for i := range cfg.Servers {
		cfg.Servers[i].KVBytes = 4 << 30
	}
	cfg.Engine.MaxModelLen = maxLen
	out, err := RunScriptSim(context.Background(), cfg, s, "sticky", 0)
	if err != nil {
		t.Fatal(err)
	}
	over := 0
	for i, r := range recs {
		res := out.Results[i]
		if r.InputLength+r.OutputLength > maxLen {
			over++
			if !res.Rejected {
				t.Fatalf("request %d (%d+%d tokens) was not rejected: %+v", i, r.InputLength, r.OutputLength, res)
			}
			continue
		}
		if want := time.Duration(r.Timestamp / speedup * float64(time.Millisecond)); res.Start < want-time.Microsecond || res.Start > want+time.Microsecond {
			t.Fatalf("request %d sent at %v, want %v", i, res.Start, want)
		}
		if res.Err != "" || res.PromptTokens != r.InputLength || res.OutputTokens != r.OutputLength {
			t.Fatalf("request %d: %+v for record %+v", i, res, r)
		}
	}
	if over == 0 {
		t.Fatal("the test trace has no request over max_model_len: the rejection path is untested")
	}
	sum := SummarizeScript(out)
	if sum.Rejected != over || sum.Errors != 0 || sum.Requests != len(recs) {
		t.Fatalf("summary %+v, want %d rejected of %d", sum, over, len(recs))
	}
	if want := TraceBound(recs, 16, maxLen); sum.BoundCachedRatio < want-1e-9 || sum.BoundCachedRatio > want+1e-9 {
		t.Fatalf("in-run bound %v, trace bound %v", sum.BoundCachedRatio, want)
	}
	if sum.CachedRatio <= 0 || sum.CachedRatio > sum.BoundCachedRatio {
		t.Fatalf("cached ratio %v outside (0, bound %v]", sum.CachedRatio, sum.BoundCachedRatio)
	}
	if sum.LoadSpread < 1 || sum.LoadSpread > float64(len(cfg.Servers)) {
		t.Fatalf("load spread %v outside [1, servers]", sum.LoadSpread)
	}
}

func TestTraceBound(t *testing.T) {
	recs := []TraceRecord{
		{InputLength: 1024, OutputLength: 1, HashIDs: []int64{1, 2}},
		{InputLength: 1024, OutputLength: 1, HashIDs: []int64{1, 2}},  // all but the last block
		{InputLength: 600, OutputLength: 1, HashIDs: []int64{1, 3}},   // the first 512
		{InputLength: 600, OutputLength: 500, HashIDs: []int64{1, 4}}, // over maxLen: skipped
	}
	want := float64(1024-16+512) / float64(1024+1024+600)
	if got := TraceBound(recs, 16, 1050); got < want-1e-12 || got > want+1e-12 {
		t.Fatalf("bound %v, want %v", got, want)
	}
}
