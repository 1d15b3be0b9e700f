package field_test

import (
	"errors"
	"testing"

	"github.com/kvrouter/kvrouter/config/field"
)

func TestPaths(t *testing.T) {
	tests := []struct {
		name, got, want string
	}{
		{"join field", field.Join("endpoints[0]", "address"), "endpoints[0].address"},
		{"join index", field.Join("endpoints", "[0]"), "endpoints[0]"},
		{"join empty prefix", field.Join("", "limits"), "limits"},
		{"join empty rel", field.Join("limits", ""), "limits"},
		{"index", field.Index("models", 2), "models[2]"},
		{"plain key", field.Key("weights", "load_2"), "weights.load_2"},
		{"key with slash", field.Key("models", "Qwen/Qwen3-0.6B"), `models["Qwen/Qwen3-0.6B"]`},
		{"key with dot", field.Key("models", "a.b"), `models["a.b"]`},
		{"key with quote", field.Key("models", `a"b`), `models["a\"b"]`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if tc.got != tc.want {
				t.Errorf("got %q, want %q", tc.got, tc.want)
			}
		})
	}
}

func TestNest(t *testing.T) {
	var inner field.Errors
	inner.Addf("address", "is required")
	inner.Addf("", "whole section")
	tests := []struct {
		name string
		err  error
		want string
	}{
		{"nil", nil, ""},
		{"list", inner.Err(), "endpoints[1].address: is required\nendpoints[1]: whole section"},
		{"single", &field.Error{Path: "x", Msg: "bad"}, "endpoints[1].x: bad"},
		{"plain error", errors.New("boom"), "endpoints[1]: boom"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var errs field.Errors
			errs.Nest("endpoints[1]", tc.err)
			got := ""
			if err := errs.Err(); err != nil {
				got = err.Error()
			}
			if got != tc.want {
				t.Errorf("got %q, want %q", got, tc.want)
			}
		})
	}
}
