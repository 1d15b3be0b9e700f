package jinja

import (
	"math"
	"strings"
	"testing"
)

func TestPyFloatRepr(t *testing.T) {
	tests := []struct {
		in   float64
		want string
	}{
		{1, "1.0"}, {0, "0.0"}, {math.Copysign(0, -1), "-0.0"}, {1e-07, "1e-07"},
		{0.0001, "0.0001"}, {0.00001, "1e-05"}, {1e16, "1e+16"}, {1e15, "1000000000000000.0"},
		{123456789.123456789, "123456789.12345679"}, {1.5e300, "1.5e+300"}, {-2.5e-10, "-2.5e-10"},
		{0.1, "0.1"}, {2.5, "2.5"}, {100000, "100000.0"}, {1e22, "1e+22"}, {5e-324, "5e-324"},
		{math.MaxFloat64, "1.7976931348623157e+308"}, {9999999999999998, "9999999999999998.0"},
	}
	for _, tt := range tests {
		t.Run(tt.want, func(t *testing.T) {
			if got := pyFloatRepr(tt.in); got != tt.want {
				t.Fatalf("pyFloatRepr(%v) = %q, want %q", tt.in, got, tt.want)
			}
		})
	}
	for in, want := range map[float64]string{math.Inf(1): "Infinity", math.Inf(-1): "-Infinity"} {
		if got := pyFloatJSON(in); got != want {
			t.Errorf("pyFloatJSON(%v) = %q, want %q", in, got, want)
		}
	}
	if got := pyFloatJSON(math.NaN()); got != "NaN" {
		t.Errorf("NaN: %q", got)
	}
}

func TestWritePyString(t *testing.T) {
	tests := []struct {
		name, in, want, wantASCII string
	}{
		{"plain", "abc", `"abc"`, `"abc"`},
		{"escapes", "q\"b\\n\n\r\t\b\f", `"q\"b\\n\n\r\t\b\f"`, `"q\"b\\n\n\r\t\b\f"`},
		{"controls", "\x00\x01\x1f", `"\u0000\u0001\u001f"`, `"\u0000\u0001\u001f"`},
		{"del and html", "\x7f</script>&'", "\"\x7f</script>&'\"", `"\u007f</script>&'"`},
		{"non-ascii", "é→😀\u2028", "\"é→😀\u2028\"", `"\u00e9\u2192\ud83d\ude00\u2028"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var b strings.Builder
			writeJSONString(&b, tt.in, false)
			if b.String() != tt.want {
				t.Errorf("ensure_ascii=False: got %s want %s", b.String(), tt.want)
			}
			b.Reset()
			writeJSONString(&b, tt.in, true)
			if b.String() != tt.wantASCII {
				t.Errorf("ensure_ascii=True: got %s want %s", b.String(), tt.wantASCII)
			}
		})
	}
}
