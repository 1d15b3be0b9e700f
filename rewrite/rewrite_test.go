package rewrite_test

import (
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/rewrite"
)

func exact(models ...string) []rewrite.Match {
	var ms []rewrite.Match
	for _, m := range models {
		ms = append(ms, rewrite.Match{Model: rewrite.ModelMatch{Value: m}})
	}
	return ms
}

func to(models ...string) []rewrite.Target {
	var ts []rewrite.Target
	for _, m := range models {
		ts = append(ts, rewrite.Target{ModelRewrite: m})
	}
	return ts
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		r    rewrite.Rewrite
		want string // "" when valid
	}{
		{name: "alias", r: rewrite.Rewrite{Name: "a", Rules: []rewrite.Rule{{Matches: exact("m"), Targets: to("m-v1")}}}},
		{name: "generic", r: rewrite.Rewrite{Name: "a", Rules: []rewrite.Rule{{Targets: to("base")}}}},
		{name: "weighted", r: rewrite.Rewrite{Name: "a", Rules: []rewrite.Rule{{Matches: exact("m"),
			Targets: []rewrite.Target{{ModelRewrite: "v1", Weight: 90}, {ModelRewrite: "v2", Weight: 10}}}}}},
		{name: "explicit exact", r: rewrite.Rewrite{Name: "a", Rules: []rewrite.Rule{{
			Matches: []rewrite.Match{{Model: rewrite.ModelMatch{Type: "Exact", Value: "m"}}}, Targets: to("x")}}}},
		{name: "no rules", r: rewrite.Rewrite{Name: "a"}, want: "rules: at least one rule is required"},
		{name: "no targets", r: rewrite.Rewrite{Name: "a", Rules: []rewrite.Rule{{Matches: exact("m")}}},
			want: "rules[0].targets: at least one target is required"},
		{name: "empty target", r: rewrite.Rewrite{Name: "a", Rules: []rewrite.Rule{{Targets: to("")}}},
			want: "rules[0].targets[0].model_rewrite: is required"},
		{name: "some weights", r: rewrite.Rewrite{Name: "a", Rules: []rewrite.Rule{{
			Targets: []rewrite.Target{{ModelRewrite: "v1", Weight: 90}, {ModelRewrite: "v2"}}}}},
			want: "rules[0].targets: 1 of 2 targets have a weight: set a weight on every target or on none"},
		{name: "weight too large", r: rewrite.Rewrite{Name: "a", Rules: []rewrite.Rule{{
			Targets: []rewrite.Target{{ModelRewrite: "v1", Weight: 1_000_001}}}}},
			want: "rules[0].targets[0].weight: 1000001 is out of range (1..1000000)"},
		{name: "negative weight", r: rewrite.Rewrite{Name: "a", Rules: []rewrite.Rule{{
			Targets: []rewrite.Target{{ModelRewrite: "v1", Weight: -1}}}}},
			want: "rules[0].targets[0].weight: -1 is out of range"},
		{name: "match type", r: rewrite.Rewrite{Name: "a", Rules: []rewrite.Rule{{
			Matches: []rewrite.Match{{Model: rewrite.ModelMatch{Type: "Prefix", Value: "m"}}}, Targets: to("x")}}},
			want: `rules[0].matches[0].model.type: "Prefix" is not a match type: the only one is "Exact"`},
		{name: "match value", r: rewrite.Rewrite{Name: "a", Rules: []rewrite.Rule{{
			Matches: []rewrite.Match{{}}, Targets: to("x")}}},
			want: "rules[0].matches[0].model.value: is required"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.r.Validate()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("Validate: %v", err)
			case tc.want != "" && err == nil:
				t.Fatalf("Validate accepted it, want %q", tc.want)
			case tc.want != "" && !strings.Contains(err.Error(), tc.want):
				t.Fatalf("Validate: %v\nwant %q", err, tc.want)
			}
			if _, terr := rewrite.NewTable([]rewrite.Rewrite{tc.r}); (terr == nil) != (err == nil) {
				t.Errorf("NewTable: %v, Validate: %v", terr, err)
			}
		})
	}
}

// The resource's precedence: an exact match wins over a generic rule, the earlier
// Rewrite (the older resource) over a later one, the first rule of a Rewrite over the
// next.
func TestTablePrecedence(t *testing.T) {
	rws := []rewrite.Rewrite{
		{Name: "oldest", Rules: []rewrite.Rule{
			{Matches: exact("a"), Targets: to("a-old")},
			{Matches: exact("a", "b"), Targets: to("ab-second-rule")},
			{Targets: to("generic-old")},
		}},
		{Name: "newer", Rules: []rewrite.Rule{
			{Targets: to("generic-new")},
			{Matches: exact("a"), Targets: to("a-new")},
			{Matches: exact("c"), Targets: to("c-new")},
		}},
	}
	tab, err := rewrite.NewTable(rws)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		model, name, target string
		exact               bool
	}{
		{model: "a", name: "oldest", target: "a-old", exact: true},
		{model: "b", name: "oldest", target: "ab-second-rule", exact: true},
		{model: "c", name: "newer", target: "c-new", exact: true},
		{model: "unknown", name: "oldest", target: "generic-old"},
	} {
		t.Run(tc.model, func(t *testing.T) {
			d, ok := tab.Lookup(tc.model)
			if !ok {
				t.Fatal("no rule")
			}
			if d.Name != tc.name || d.Targets[0].ModelRewrite != tc.target || d.Exact != tc.exact {
				t.Errorf("got %s -> %s (exact %v), want %s -> %s (exact %v)", d.Name, d.Targets[0].ModelRewrite, d.Exact, tc.name, tc.target, tc.exact)
			}
		})
	}
	noGeneric, _ := rewrite.NewTable([]rewrite.Rewrite{{Name: "x", Rules: rws[0].Rules[:2]}})
	if _, ok := noGeneric.Lookup("unknown"); ok {
		t.Error("a model no rule names matched without a generic rule")
	}
	var empty *rewrite.Table
	if _, ok := empty.Lookup("a"); ok || !empty.Empty() {
		t.Error("a nil Table matched")
	}
}

// seq returns an intn giving 0, 1, 2, ... modulo n: every draw of a cycle of total
// draws once, so shares are exact.
func seq() func(int) int {
	i := 0
	return func(n int) int { i++; return (i - 1) % n }
}

func TestChoose(t *testing.T) {
	weighted := []rewrite.Target{{ModelRewrite: "v1", Weight: 90}, {ModelRewrite: "v2", Weight: 10}}
	for _, tc := range []struct {
		name     string
		targets  []rewrite.Target
		eligible func(string) bool
		draws    int
		want     map[string]int
	}{
		{name: "weights", targets: weighted, draws: 100, want: map[string]int{"v1": 90, "v2": 10}},
		{name: "equal shares", targets: to("a", "b", "c"), draws: 300, want: map[string]int{"a": 100, "b": 100, "c": 100}},
		{name: "only eligible", targets: weighted, eligible: func(m string) bool { return m == "v2" }, draws: 10, want: map[string]int{"v2": 10}},
		{name: "none eligible", targets: weighted, eligible: func(string) bool { return false }, draws: 5, want: map[string]int{"": 5}},
		{name: "many targets", targets: to("a", "b", "c", "d", "e", "f", "g", "h", "i", "j", "k", "l", "m", "n", "o", "p", "q"), draws: 17,
			want: map[string]int{"a": 1, "b": 1, "c": 1, "d": 1, "e": 1, "f": 1, "g": 1, "h": 1, "i": 1, "j": 1, "k": 1, "l": 1, "m": 1, "n": 1, "o": 1, "p": 1, "q": 1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			intn := seq()
			got := map[string]int{}
			for range tc.draws {
				m, ok := rewrite.Choose(tc.targets, tc.eligible, intn)
				if ok == (m == "") {
					t.Fatalf("Choose = %q, %v", m, ok)
				}
				got[m]++
			}
			if len(got) != len(tc.want) {
				t.Fatalf("got %v, want %v", got, tc.want)
			}
			for m, n := range tc.want {
				if got[m] != n {
					t.Errorf("got %v, want %v", got, tc.want)
				}
			}
		})
	}
}
