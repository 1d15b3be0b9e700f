package config_test

import (
	"reflect"
	"testing"

	"github.com/kvrouter/kvrouter/config"
	"github.com/kvrouter/kvrouter/rewrite"
)

// model_rewrites decodes onto the InferenceModelRewrite's shape, and its Table applies
// the resource's precedence with list order standing for age.
func TestModelRewritesDecode(t *testing.T) {
	const endpoints = "endpoints: [{address: \"127.0.0.1:1\", models: [m, m-v1, m-v2], lora_adapters: [{name: ad, base_model: m}]}]\n"
	tests := []struct {
		name   string
		doc    string
		want   config.ModelRewrites
		lookup map[string]string // model -> the first target of the rule that applies ("": none)
	}{
		{name: "none", doc: "", want: nil, lookup: map[string]string{"m": ""}},
		{name: "alias, generic and canary", doc: `
model_rewrites:
  - name: alias
    rules:
      - matches: [{model: {type: Exact, value: small}}, {model: {value: tiny}}]
        targets: [{model_rewrite: ad}]
  - name: canary
    rules:
      - matches: [{model: {value: m}}]
        targets:
          - {model_rewrite: m-v1, weight: 90}
          - {model_rewrite: m-v2, weight: 10}
      - targets: [{model_rewrite: m}]
`,
			want: config.ModelRewrites{
				{Name: "alias", Rules: []rewrite.Rule{{
					Matches: []rewrite.Match{{Model: rewrite.ModelMatch{Type: "Exact", Value: "small"}}, {Model: rewrite.ModelMatch{Value: "tiny"}}},
					Targets: []rewrite.Target{{ModelRewrite: "ad"}}}}},
				{Name: "canary", Rules: []rewrite.Rule{
					{Matches: []rewrite.Match{{Model: rewrite.ModelMatch{Value: "m"}}},
						Targets: []rewrite.Target{{ModelRewrite: "m-v1", Weight: 90}, {ModelRewrite: "m-v2", Weight: 10}}},
					{Targets: []rewrite.Target{{ModelRewrite: "m"}}}}},
			},
			lookup: map[string]string{"small": "ad", "tiny": "ad", "m": "m-v1", "anything": "m"}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := config.Parse([]byte(endpoints+tc.doc), "inline")
			if err != nil {
				t.Fatal(err)
			}
			if !reflect.DeepEqual(cfg.ModelRewrites, tc.want) {
				t.Fatalf("model_rewrites %+v\nwant %+v", cfg.ModelRewrites, tc.want)
			}
			tab, err := cfg.ModelRewrites.Table()
			if err != nil {
				t.Fatal(err)
			}
			if (tab == nil) != (len(tc.want) == 0) {
				t.Errorf("Table() = %v for %d rewrites", tab, len(tc.want))
			}
			for model, want := range tc.lookup {
				d, ok := tab.Lookup(model)
				got := ""
				if ok {
					got = d.Targets[0].ModelRewrite
				}
				if got != want {
					t.Errorf("Lookup(%q) -> %q, want %q", model, got, want)
				}
			}
		})
	}
}
