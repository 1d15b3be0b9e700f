package examples_test

import (
	"encoding/json"
	"io/fs"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

type dashboard struct {
	Title  string `json:"title"`
	UID    string `json:"uid"`
	Panels []struct {
		ID      int    `json:"id"`
		Type    string `json:"type"`
		Title   string `json:"title"`
		Targets []struct {
			Expr string `json:"expr"`
		} `json:"targets"`
	} `json:"panels"`
}

var (
	metricRef  = regexp.MustCompile(`\bkvrouter_[a-z0-9_]+`)
	metricName = regexp.MustCompile(`"(kvrouter_[a-z0-9_]+)"`)
)

// registeredMetrics collects the kvrouter_* names written as string literals in the
// repository's non-test Go files: the metrics the code can export.
func registeredMetrics(t *testing.T) map[string]bool {
	t.Helper()
	names := map[string]bool{}
	err := filepath.WalkDir("..", func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (d.Name() == "testdata" || strings.HasPrefix(d.Name(), ".")) && path != ".." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		data, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range metricName.FindAllStringSubmatch(string(data), -1) {
			names[m[1]] = true
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return names
}

// owners maps metric prefixes to the file that registers them on its helper's branch,
// for trees where that branch is not merged yet.
var owners = []struct{ prefix, file string }{
	{"kvrouter_index_", "index/metrics.go"},
	{"kvrouter_scoring_", "scoring/kvcore.go"},
	{"kvrouter_kv_events_", "kvevents/metrics.go"},
}

func TestDashboard(t *testing.T) {
	data, err := os.ReadFile("grafana/kvrouter-dashboard.json")
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(strings.NewReader(string(data)))
	var d dashboard
	if err := dec.Decode(&d); err != nil {
		t.Fatal(err)
	}
	if d.UID == "" || len(d.Panels) == 0 {
		t.Fatalf("dashboard %q has no uid or no panel", d.Title)
	}
	registered := registeredMetrics(t)
	ids := map[int]bool{}
	used := map[string]bool{}
	for _, p := range d.Panels {
		if ids[p.ID] {
			t.Errorf("panel id %d used twice", p.ID)
		}
		ids[p.ID] = true
		if p.Type != "row" && len(p.Targets) == 0 {
			t.Errorf("panel %q has no query", p.Title)
		}
		for _, tg := range p.Targets {
			for _, m := range metricRef.FindAllString(tg.Expr, -1) {
				for _, suf := range []string{"_bucket", "_sum", "_count"} {
					m = strings.TrimSuffix(m, suf)
				}
				used[m] = true
			}
		}
	}
	// The panels the issue asks for.
	for _, m := range []string{"kvrouter_routing_decisions_total", "kvrouter_scoring_matched_blocks_total",
		"kvrouter_cached_prompt_tokens_total", "kvrouter_index_blocks", "kvrouter_kv_events_lag_seconds",
		"kvrouter_routing_decision_duration_seconds"} {
		if !used[m] {
			t.Errorf("no panel shows %s", m)
		}
	}
	names := make([]string, 0, len(used))
	for m := range used {
		names = append(names, m)
	}
	slices.Sort(names)
	for _, m := range names {
		if registered[m] {
			continue
		}
		owner := ""
		for _, o := range owners {
			if strings.HasPrefix(m, o.prefix) {
				owner = o.file
			}
		}
		if owner != "" {
			if _, err := os.Stat(filepath.Join("..", owner)); err != nil {
				t.Logf("%s: %s is not in this tree; not checked", m, owner)
				continue
			}
		}
		t.Errorf("the dashboard queries %s, which no package registers", m)
	}
}
