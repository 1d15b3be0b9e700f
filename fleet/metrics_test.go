package fleet_test

import (
	"errors"
	"os"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/fleet"
	"github.com/kvrouter/kvrouter/scoring"
)

// genTokens is vLLM's vllm:request_generation_tokens histogram for two engines of model m
// and one of another model (buckets trimmed).
const genTokens = `# HELP vllm:request_generation_tokens Number of generation tokens processed.
# TYPE vllm:request_generation_tokens histogram
vllm:request_generation_tokens_bucket{engine="0",le="1.0",model_name="m"} 0.0
vllm:request_generation_tokens_bucket{engine="0",le="500.0",model_name="m"} 3.0
vllm:request_generation_tokens_bucket{engine="0",le="+Inf",model_name="m"} 4.0
vllm:request_generation_tokens_count{engine="0",model_name="m"} 4.0
vllm:request_generation_tokens_sum{engine="0",model_name="m"} 1400.0
vllm:request_generation_tokens_bucket{engine="1",le="+Inf",model_name="m"} 2.0
vllm:request_generation_tokens_count{engine="1",model_name="m"} 2.0
vllm:request_generation_tokens_sum{engine="1",model_name="m"} 200.0
vllm:request_generation_tokens_bucket{engine="0",le="+Inf",model_name="other"} 9.0
vllm:request_generation_tokens_count{engine="0",model_name="other"} 9.0
vllm:request_generation_tokens_sum{engine="0",model_name="other"} 9000.0
`

func TestParseMetrics(t *testing.T) {
	real, err := os.ReadFile("testdata/vllm-metrics.txt")
	if err != nil {
		t.Fatal(err)
	}
	fill := strings.NewReplacer("{{.Running}}", "3.0", "{{.Waiting}}", "1.0", "{{.Usage}}", "0.42", "{{.Blocks}}", "585")
	read := func(name string) string {
		b, err := os.ReadFile("testdata/" + name)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	tests := []struct {
		name    string
		text    string
		models  []string
		want    scoring.Metrics
		wantErr string // ParseError reason
	}{
		{
			name: "vllm exposition", text: fill.Replace(string(real)), models: []string{"Qwen/Qwen3-0.6B"},
			want: scoring.Metrics{Valid: true, Running: 3, Waiting: 1, KVCacheUsage: 0.42, NumGPUBlocks: 585, BlockSize: 16},
		},
		{
			name: "model not in labels counts everything", text: fill.Replace(string(real)), models: []string{"served-alias"},
			want: scoring.Metrics{Valid: true, Running: 3, Waiting: 1, KVCacheUsage: 0.42, NumGPUBlocks: 585, BlockSize: 16},
		},
		{
			name: "two engines and a foreign model", text: read("vllm-metrics-dp2-two-models.txt"), models: []string{"Qwen/Qwen3-0.6B"},
			want: scoring.Metrics{Valid: true, Running: 5, Waiting: 1, KVCacheUsage: 0.5, NumGPUBlocks: 9000, BlockSize: 32},
		},
		{
			name: "pre-0.10 gpu_cache_usage_perc", text: read("vllm-metrics-v0.8.txt"), models: []string{"m"},
			want: scoring.Metrics{Valid: true, Running: 1, Waiting: 0, KVCacheUsage: 0.5},
		},
		{
			name: "usage clamped", models: []string{"m"},
			text: "vllm:num_requests_running 0\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc 1.5\n",
			want: scoring.Metrics{Valid: true, KVCacheUsage: 1},
		},
		{
			name: "cache_config_info with unparsable labels is ignored", models: []string{"m"},
			text: "vllm:num_requests_running 2\nvllm:num_requests_waiting 0\nvllm:cache_config_info{num_gpu_blocks=\"None\",block_size=\"16\"} 1\n",
			want: scoring.Metrics{Valid: true, Running: 2},
		},
		{
			name: "malformed sample of another family is skipped", models: []string{"m"},
			text: "# HELP foo broken\n# TYPE foo gauge\nfoo{le=\"1 2\nvllm:num_requests_running 2\nvllm:num_requests_waiting 1\n",
			want: scoring.Metrics{Valid: true, Running: 2, Waiting: 1},
		},
		{
			name: "quoted metric names are parsed whole", models: []string{"m"},
			text: "{\"my.metric\"} 1\nvllm:num_requests_running 2\nvllm:num_requests_waiting 1\n",
			want: scoring.Metrics{Valid: true, Running: 2, Waiting: 1},
		},
		{
			name: "request_generation_tokens summed over the model's engines", models: []string{"m"},
			text: "vllm:num_requests_running 2\nvllm:num_requests_waiting 1\n" + genTokens,
			want: scoring.Metrics{Valid: true, Running: 2, Waiting: 1, FinishedRequests: 6, OutputTokens: 1600},
		},
		{
			name: "request_generation_tokens of no listed model counts all", models: []string{"x"},
			text: "vllm:num_requests_running 2\nvllm:num_requests_waiting 1\n" + genTokens,
			want: scoring.Metrics{Valid: true, Running: 2, Waiting: 1, FinishedRequests: 15, OutputTokens: 10600},
		},
		{
			name: "request_generation_tokens with a NaN sum is left out", models: []string{"m"},
			text: "vllm:num_requests_running 2\nvllm:num_requests_waiting 1\n# TYPE vllm:request_generation_tokens histogram\n" +
				"vllm:request_generation_tokens_bucket{le=\"+Inf\"} 3\nvllm:request_generation_tokens_count 3\nvllm:request_generation_tokens_sum NaN\n",
			want: scoring.Metrics{Valid: true, Running: 2, Waiting: 1},
		},
		{name: "comments and blank lines", models: []string{"m"},
			text: "# a comment\n\n  # HELP vllm:num_requests_running x\n#\tTYPE vllm:num_requests_running gauge\n vllm:num_requests_running 2\nvllm:num_requests_waiting 1 1700000000000\n",
			want: scoring.Metrics{Valid: true, Running: 2, Waiting: 1},
		},
		{name: "second TYPE line of a family read", models: []string{"m"},
			text:    "# TYPE vllm:num_requests_running gauge\n# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 2\nvllm:num_requests_waiting 1\n",
			wantErr: "syntax"},
		{name: "malformed sample of a family read", models: []string{"m"},
			text: "vllm:num_requests_running{model_name=\"m} 2\nvllm:num_requests_waiting 1\n", wantErr: "syntax"},
		{name: "garbage after a plain name", text: "vllm:num_requests_running 1\nvllm:num_requests_waiting 1\nfoo=bar\n", wantErr: "syntax"},
		{name: "empty body", text: "", wantErr: "missing"},
		{name: "no waiting gauge", text: "vllm:num_requests_running 1\n", wantErr: "missing"},
		{name: "not prometheus text", text: "<html>502 Bad Gateway</html>\n", wantErr: "syntax"},
		{name: "negative", text: "vllm:num_requests_running -1\nvllm:num_requests_waiting 0\n", wantErr: "value"},
		{name: "NaN", text: "vllm:num_requests_running NaN\nvllm:num_requests_waiting 0\n", wantErr: "value"},
		{name: "infinite usage", text: "vllm:num_requests_running 1\nvllm:num_requests_waiting 0\nvllm:kv_cache_usage_perc +Inf\n", wantErr: "value"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			got, err := fleet.ParseMetrics(strings.NewReader(tc.text), tc.models)
			if tc.wantErr != "" {
				var pe *fleet.ParseError
				if !errors.As(err, &pe) || pe.Reason != tc.wantErr {
					t.Fatalf("err = %v, want ParseError with reason %q", err, tc.wantErr)
				}
				if got.Valid {
					t.Error("Valid set on error")
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

func FuzzParseMetrics(f *testing.F) {
	for _, name := range []string{"vllm-metrics.txt", "vllm-metrics-dp2-two-models.txt", "vllm-metrics-v0.8.txt"} {
		b, err := os.ReadFile("testdata/" + name)
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	f.Add([]byte("vllm:num_requests_running 1\nvllm:num_requests_waiting 2\n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		m, err := fleet.ParseMetrics(strings.NewReader(string(b)), []string{"Qwen/Qwen3-0.6B"})
		if err != nil {
			var pe *fleet.ParseError
			if !errors.As(err, &pe) {
				t.Fatalf("error %v is not a *ParseError", err)
			}
			return
		}
		if !m.Valid || m.Running < 0 || m.Waiting < 0 || m.KVCacheUsage < 0 || m.KVCacheUsage > 1 {
			t.Fatalf("accepted figures out of range: %+v", m)
		}
	})
}

func BenchmarkParseMetrics(b *testing.B) {
	real, err := os.ReadFile("testdata/vllm-metrics.txt")
	if err != nil {
		b.Fatal(err)
	}
	text := strings.NewReplacer("{{.Running}}", "3.0", "{{.Waiting}}", "1.0", "{{.Usage}}", "0.42", "{{.Blocks}}", "585").Replace(string(real))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := fleet.ParseMetrics(strings.NewReader(text), []string{"Qwen/Qwen3-0.6B"}); err != nil {
			b.Fatal(err)
		}
	}
}
