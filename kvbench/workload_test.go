package kvbench

import (
	"encoding/json"
	"errors"
	"reflect"
	"strings"
	"testing"
)

// wordTokenizer is a hand-written fake: one token per space-separated word, looked up in
// the embedded word list; unknown words fail.
type wordTokenizer struct {
	ids   map[string]uint32
	calls int
}

// mustWords is the embedded word list; tests stop at once if it does not parse.
func mustWords() []word {
	w, err := qwen3Words()
	if err != nil {
		panic(err)
	}
	return w
}

func newWordTokenizer() *wordTokenizer {
	t := &wordTokenizer{ids: map[string]uint32{}}
	for _, w := range mustWords() {
		t.ids[w.text] = w.id
	}
	return t
}

func (t *wordTokenizer) Encode(text string) ([]uint32, error) {
	t.calls++
	var out []uint32
	for _, w := range strings.Fields(text) {
		id, ok := t.ids[w]
		if !ok {
			return nil, errors.New("unknown word " + w)
		}
		out = append(out, id)
	}
	return out, nil
}

// mergingTokenizer merges every word starting with "t" with the word after it into one
// token, so texts need extending to reach their count.
type mergingTokenizer struct{ wordTokenizer }

func (t *mergingTokenizer) Encode(text string) ([]uint32, error) {
	ids, err := t.wordTokenizer.Encode(text)
	if err != nil {
		return nil, err
	}
	words := strings.Fields(text)
	var out []uint32
	for i := 0; i < len(ids); i++ {
		out = append(out, ids[i])
		if strings.HasPrefix(words[i], "t") && i+1 < len(ids) {
			i++ // merged into the previous token
		}
	}
	return out, nil
}

func smallConfig() WorkloadConfig {
	c := DefaultWorkloadConfig()
	c.PrefixTokens, c.TailTokens, c.Requests, c.Warmup = 64, 20, 30, 5
	return c
}

func TestWorkloadDeterministic(t *testing.T) {
	a, err := NewWorkload(smallConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	b, err := NewWorkload(smallConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(a.Requests(), b.Requests()) {
		t.Fatal("same seed gave different requests")
	}
	for k := 0; k < smallConfig().Prefixes; k++ {
		if a.PrefixText(k) != b.PrefixText(k) {
			t.Fatalf("prefix %d differs for the same seed", k)
		}
	}
	other := smallConfig()
	other.Seed++
	c, err := NewWorkload(other, nil)
	if err != nil {
		t.Fatal(err)
	}
	if reflect.DeepEqual(a.Requests(), c.Requests()) {
		t.Fatal("different seeds gave the same requests")
	}
}

func TestWorkloadShape(t *testing.T) {
	tests := []struct {
		name string
		tok  Tokenizer
	}{
		{"embedded ids", nil},
		{"word tokenizer", newWordTokenizer()},
		{"merging tokenizer", &mergingTokenizer{*newWordTokenizer()}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := smallConfig()
			w, err := NewWorkload(cfg, tt.tok)
			if err != nil {
				t.Fatal(err)
			}
			reqs := w.Requests()
			if len(reqs) != cfg.Requests+cfg.Warmup {
				t.Fatalf("got %d requests, want %d", len(reqs), cfg.Requests+cfg.Warmup)
			}
			for k := 0; k < cfg.Prefixes; k++ {
				if got := len(w.PrefixIDs(k)); got != cfg.PrefixTokens {
					t.Errorf("prefix %d has %d ids, want %d", k, got, cfg.PrefixTokens)
				}
				if tt.tok != nil {
					ids, _ := tt.tok.Encode(w.PrefixText(k))
					if len(ids) != cfg.PrefixTokens {
						t.Errorf("prefix %d tokenizes to %d, want %d", k, len(ids), cfg.PrefixTokens)
					}
				}
			}
			tails := map[string]bool{}
			for i, r := range reqs {
				if r.Seq != i || r.Warmup != (i < cfg.Warmup) {
					t.Errorf("request %d: seq %d warmup %v", i, r.Seq, r.Warmup)
				}
				if len(r.TailIDs) != cfg.TailTokens {
					t.Errorf("request %d tail has %d ids, want %d", i, len(r.TailIDs), cfg.TailTokens)
				}
				if tails[r.Tail] {
					t.Errorf("request %d repeats a tail", i)
				}
				tails[r.Tail] = true
				if got := len(w.TokenIDs(&r)); got != cfg.PrefixTokens+cfg.TailTokens {
					t.Errorf("request %d prompt has %d ids", i, got)
				}
			}
		})
	}
}

func TestWorkloadPrefixesDifferInFirstBlock(t *testing.T) {
	cfg := smallConfig()
	cfg.Prefixes = 24
	w, err := NewWorkload(cfg, nil)
	if err != nil {
		t.Fatal(err)
	}
	seen := map[[16]uint32]bool{}
	for k := 0; k < cfg.Prefixes; k++ {
		var first [16]uint32
		copy(first[:], w.PrefixIDs(k))
		if seen[first] {
			t.Fatalf("prefix %d shares its first block with another", k)
		}
		seen[first] = true
	}
}

func TestWorkloadPopularity(t *testing.T) {
	tests := []struct {
		name      string
		zipf      float64
		wantFirst [2]float64 // share of prefix 0, min and max
	}{
		{"uniform", 0, [2]float64{0.06, 0.14}},
		{"zipf 1.2", 1.2, [2]float64{0.40, 0.60}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := smallConfig()
			cfg.Prefixes, cfg.Requests, cfg.TailTokens, cfg.PrefixTokens = 10, 4000, 16, 16
			cfg.Zipf = tt.zipf
			w, err := NewWorkload(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			count := make([]int, cfg.Prefixes)
			for _, r := range w.Requests() {
				count[r.Prefix]++
			}
			share := float64(count[0]) / float64(len(w.Requests()))
			if share < tt.wantFirst[0] || share > tt.wantFirst[1] {
				t.Errorf("prefix 0 drew %.3f of requests, want in %v", share, tt.wantFirst)
			}
			for k, c := range count {
				if c == 0 {
					t.Errorf("prefix %d never drawn", k)
				}
			}
		})
	}
}

func TestWorkloadValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*WorkloadConfig)
	}{
		{"no prefixes", func(c *WorkloadConfig) { c.Prefixes = 0 }},
		{"no prefix tokens", func(c *WorkloadConfig) { c.PrefixTokens = 0 }},
		{"no tail", func(c *WorkloadConfig) { c.TailTokens = 0 }},
		{"no output", func(c *WorkloadConfig) { c.OutputTokens = 0 }},
		{"no requests", func(c *WorkloadConfig) { c.Requests = 0 }},
		{"negative warmup", func(c *WorkloadConfig) { c.Warmup = -1 }},
		{"negative zipf", func(c *WorkloadConfig) { c.Zipf = -1 }},
		{"unknown api", func(c *WorkloadConfig) { c.API = "embeddings" }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultWorkloadConfig()
			tt.mutate(&c)
			if _, err := NewWorkload(c, nil); err == nil {
				t.Fatal("no error")
			}
		})
	}
}

func TestWorkloadBody(t *testing.T) {
	for _, api := range []API{APICompletions, APIChat} {
		t.Run(string(api), func(t *testing.T) {
			cfg := smallConfig()
			cfg.API = api
			w, err := NewWorkload(cfg, nil)
			if err != nil {
				t.Fatal(err)
			}
			r := &w.Requests()[0]
			var body map[string]any
			if err := json.Unmarshal(w.Body(r, "m", true), &body); err != nil {
				t.Fatal(err)
			}
			if body["model"] != "m" || body["stream"] != true || body["ignore_eos"] != true ||
				body["max_tokens"] != float64(cfg.OutputTokens) {
				t.Errorf("body %v", body)
			}
			if so, _ := body["stream_options"].(map[string]any); so["include_usage"] != true {
				t.Errorf("stream_options %v", body["stream_options"])
			}
			text := w.PrefixText(r.Prefix) + r.Tail
			switch api {
			case APIChat:
				msgs := body["messages"].([]any)
				if msgs[0].(map[string]any)["content"] != text || w.Path() != "/v1/chat/completions" {
					t.Errorf("chat body %v path %s", body, w.Path())
				}
			default:
				if body["prompt"] != text || w.Path() != "/v1/completions" {
					t.Errorf("completions body %v path %s", body, w.Path())
				}
			}
		})
	}
}
