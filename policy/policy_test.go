package policy_test

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"

	"github.com/kvrouter/kvrouter/index"
	"github.com/kvrouter/kvrouter/policy"
	"github.com/kvrouter/kvrouter/scoring"
)

// TestBuiltinIsValid: the shipped list passes NewRegistry's rules, in the documented order.
func TestBuiltinIsValid(t *testing.T) {
	b := policy.Builtin()
	if _, err := policy.NewRegistry(b.Specs()...); err != nil {
		t.Fatal(err)
	}
	want := []string{"random", "round-robin", "least-load", "kv", "approximate", "placement"}
	if got := b.Names(); !slices.Equal(got, want) {
		t.Errorf("Names() = %v, want %v", got, want)
	}
	if got := b.FallbackNames(); !slices.Equal(got, []string{"random", "round-robin", "least-load"}) {
		t.Errorf("FallbackNames() = %v", got)
	}
}

// TestBuiltinBuildsEveryPolicy: each name builds a policy of that name, from the default
// configuration and the dependencies it declares.
func TestBuiltinBuildsEveryPolicy(t *testing.T) {
	ix, err := index.New(index.DefaultConfig(), nil)
	if err != nil {
		t.Fatal(err)
	}
	b := policy.Builtin()
	for _, s := range b.Specs() {
		t.Run(s.Name, func(t *testing.T) {
			p, err := b.New(s.Name, nil, policy.Deps{Index: ix})
			if err != nil {
				t.Fatal(err)
			}
			if p.Name() != s.Name {
				t.Errorf("built %q, want %q", p.Name(), s.Name)
			}
			d, err := p.Pick(&scoring.Request{ID: "r", Model: "m", BaseModel: "m"}, []scoring.Endpoint{{Address: "10.0.0.1:8000"}})
			if err != nil || d.Endpoint != "10.0.0.1:8000" {
				t.Errorf("Pick = %+v, %v", d, err)
			}
			if s.Index {
				if _, err := b.New(s.Name, nil, policy.Deps{}); err == nil || !strings.Contains(err.Error(), "needs the block index") {
					t.Errorf("built without the index it needs: %v", err)
				}
			}
		})
	}
}

// TestBuiltinReadsItsSection: a policy is built from its own section of Config, and an
// invalid section is refused by the constructor.
func TestBuiltinReadsItsSection(t *testing.T) {
	ix, _ := index.New(index.DefaultConfig(), nil)
	c := policy.DefaultConfig()
	c.Placement.Fill = 2
	if _, err := policy.Builtin().New("placement", &c, policy.Deps{Index: ix}); err == nil {
		t.Error("placement built with fill 2")
	}
	c = policy.DefaultConfig()
	c.KV.OverlapCredit = 2
	if _, err := policy.Builtin().New("approximate", &c, policy.Deps{}); err == nil {
		t.Error("approximate built with overlap_credit 2")
	}
	if _, err := policy.Builtin().New("least-load", &c, policy.Deps{}); err != nil {
		t.Errorf("least-load reads no section, yet: %v", err)
	}
}

func TestUnknownAndInvalid(t *testing.T) {
	_, err := policy.Builtin().New("nope", nil, policy.Deps{})
	var ue *policy.UnknownError
	if !errors.As(err, &ue) || ue.Name != "nope" || len(ue.Known) != 6 {
		t.Errorf("New(nope) = %v", err)
	}
	build := func(*policy.Config, policy.Deps) (scoring.Policy, error) { return scoring.NewLeastLoad(), nil }
	for _, tc := range []struct {
		name  string
		specs []policy.Spec
		want  string
	}{
		{"no name", []policy.Spec{{New: build}}, "has no name"},
		{"twice", []policy.Spec{{Name: "a", New: build}, {Name: "a", New: build}}, `"a" registered twice`},
		{"no constructor", []policy.Spec{{Name: "a"}}, "no constructor"},
		{"unknown section", []policy.Spec{{Name: "a", Section: "b", New: build}}, `unknown section "b"`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if _, err := policy.NewRegistry(tc.specs...); err == nil || !strings.Contains(err.Error(), tc.want) {
				t.Errorf("NewRegistry = %v, want %q", err, tc.want)
			}
		})
	}
	// A custom registry extends the built-in list without touching it.
	r, err := policy.NewRegistry(append(policy.Builtin().Specs(), policy.Spec{Name: "mine", New: build})...)
	if err != nil || len(r.Names()) != 7 || len(policy.Builtin().Names()) != 6 {
		t.Errorf("extended registry: %v, %v", r.Names(), err)
	}
}

// oldObserver is a policy written against the Observer before Moved was added.
type oldObserver struct{ scoring.LeastLoad }

func (oldObserver) Routed(*scoring.Request, string) {}
func (oldObserver) FirstToken(string)               {}
func (oldObserver) Finished(string)                 {}

// fullObserver has every Observer call.
type fullObserver struct{ oldObserver }

func (fullObserver) Moved(string, string) {}

// TestPartObserverRefused: the router finds observers by type assertion, so a policy with
// only some of the calls would silently get none; New refuses it by name.
func TestPartObserverRefused(t *testing.T) {
	for _, tc := range []struct {
		name    string
		p       scoring.Policy
		wantErr bool
	}{
		{"no observer calls", &scoring.LeastLoad{}, false},
		{"every call", &fullObserver{}, false},
		{"Moved missing", &oldObserver{}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			build := func(*policy.Config, policy.Deps) (scoring.Policy, error) { return tc.p, nil }
			r, err := policy.NewRegistry(policy.Spec{Name: "mine", New: build})
			if err != nil {
				t.Fatal(err)
			}
			_, err = r.New("mine", nil, policy.Deps{})
			if (err != nil) != tc.wantErr || (err != nil && !strings.Contains(err.Error(), "part of scoring.Observer")) {
				t.Errorf("New = %v, want error %v", err, tc.wantErr)
			}
		})
	}
}

// keyCounter answers that nothing is held and records how many block keys each lookup
// asked about.
type keyCounter struct{ asked []int }

func (k *keyCounter) LeadingBlocks(keys []uint64, eps []string, dst []int) []int {
	k.asked = append(k.asked, len(keys))
	return append(dst[:0], make([]int, len(eps))...)
}

// TestBlockSizeReachesThePolicies: an endpoint whose block size is not scraped is keyed
// at the served model's block size (Deps.BlockSize), by kv and by placement alike; the
// placement policy used to key at its own default of 16 whatever the model's was.
func TestBlockSizeReachesThePolicies(t *testing.T) {
	toks := make([]uint32, 64*32) // 64 blocks of 32 tokens, 128 of 16
	for i := range toks {
		toks[i] = uint32(i)
	}
	cands := []scoring.Endpoint{{Address: "10.0.0.1:8000"}, {Address: "10.0.0.2:8000"}} // no metrics
	for _, name := range []string{"kv", "placement"} {
		for _, tc := range []struct {
			blockSize, wantKeys int
		}{{0, 128}, {16, 128}, {32, 64}} {
			t.Run(fmt.Sprintf("%s block size %d", name, tc.blockSize), func(t *testing.T) {
				ix := &keyCounter{}
				p, err := policy.Builtin().New(name, nil, policy.Deps{Index: ix, BlockSize: tc.blockSize})
				if err != nil {
					t.Fatal(err)
				}
				if _, err := p.Pick(&scoring.Request{ID: "r", Model: "m", BaseModel: "m", TokenIDs: toks}, cands); err != nil {
					t.Fatal(err)
				}
				if len(ix.asked) == 0 || ix.asked[0] != tc.wantKeys {
					t.Errorf("index asked about %v keys, want %d", ix.asked, tc.wantKeys)
				}
			})
		}
	}
}
