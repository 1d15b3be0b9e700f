package fleet_test

import (
	"slices"
	"testing"

	"github.com/kvrouter/kvrouter/fleet"
)

func TestSetReady(t *testing.T) {
	clk := newClock()
	f := newFleet(t, clk, nil,
		fleet.EndpointConfig{Address: "10.0.0.1:8000", Models: []string{qwen}},
		fleet.EndpointConfig{Address: "10.0.0.2:8000", Models: []string{qwen}},
	)
	var changes []fleet.Change
	unsub := f.Subscribe(func(c fleet.Change) { changes = append(changes, c) })
	defer unsub()

	steps := []struct {
		name        string
		addr        string
		ready       bool
		exists      bool
		candidates  []string
		fleetReady  bool
		wantChanges int // notifications so far
	}{
		{"hold one out", "10.0.0.1:8000", false, true, []string{"10.0.0.2:8000"}, true, 1},
		{"holding again changes nothing", "10.0.0.1:8000", false, true, []string{"10.0.0.2:8000"}, true, 1},
		{"hold the other out", "10.0.0.2:8000", false, true, nil, false, 2},
		{"let one back in", "10.0.0.1:8000", true, true, []string{"10.0.0.1:8000"}, true, 3},
		{"unknown address", "10.0.0.9:8000", false, false, []string{"10.0.0.1:8000"}, true, 3},
	}
	for _, s := range steps {
		t.Run(s.name, func(t *testing.T) {
			if got := f.SetReady(s.addr, s.ready); got != s.exists {
				t.Errorf("SetReady = %v, want %v", got, s.exists)
			}
			eps, _, _, _ := f.Candidates(qwen)
			if got := addrs(eps); !slices.Equal(got, s.candidates) {
				t.Errorf("Candidates = %v, want %v", got, s.candidates)
			}
			if got := f.Ready(); got != s.fleetReady {
				t.Errorf("Ready = %v, want %v", got, s.fleetReady)
			}
			if len(changes) != s.wantChanges {
				t.Fatalf("%d changes, want %d: %+v", len(changes), s.wantChanges, changes)
			}
			last := changes[len(changes)-1]
			if s.exists && (last.Kind != fleet.StateChanged || last.Address != s.addr || last.Ready != s.ready) {
				t.Errorf("last change %+v, want StateChanged of %s with Ready %v", last, s.addr, s.ready)
			}
		})
	}
	t.Run("status and upsert keep readiness", func(t *testing.T) {
		if err := f.Upsert(fleet.EndpointConfig{Address: "10.0.0.2:8000", Models: []string{qwen, "other"}}); err != nil {
			t.Fatal(err)
		}
		st := status(t, f, "10.0.0.2:8000")
		if st.Ready {
			t.Errorf("endpoint held out turned ready on Upsert")
		}
		if !status(t, f, "10.0.0.1:8000").Ready {
			t.Errorf("endpoint let back in is not ready")
		}
	})
}
