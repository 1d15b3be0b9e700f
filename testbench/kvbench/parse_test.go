package kvbench

import (
	"reflect"
	"testing"
	"time"
)

func TestParseServers(t *testing.T) {
	def := ServerSpec{KVBytes: 1 << 30, Speed: 1}
	tests := []struct {
		name    string
		in      string
		want    []ServerSpec
		wantErr bool
	}{
		{"two servers", "kv=1GiB,speed=1;kv=512MiB,speed=0.5", []ServerSpec{{1 << 30, 1}, {512 << 20, 0.5}}, false},
		{"defaults fill in", "speed=2;kv=2G", []ServerSpec{{1 << 30, 2}, {2 << 30, 1}}, false},
		{"empty server", "speed=1;;speed=2", nil, true},
		{"unknown key", "gpu=1", nil, true},
		{"not key=value", "fast", nil, true},
		{"zero speed", "speed=0", nil, true},
		{"bad size", "kv=lots", nil, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ParseServers(tt.in, def)
			if (err != nil) != tt.wantErr {
				t.Fatalf("err %v", err)
			}
			if !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestParseBytes(t *testing.T) {
	for in, want := range map[string]int64{"1GiB": 1 << 30, "512MiB": 512 << 20, "4K": 4096, "1000": 1000, "1.5GiB": 3 << 29} {
		if got, err := ParseBytes(in); err != nil || got != want {
			t.Errorf("ParseBytes(%q) = %d, %v; want %d", in, got, err, want)
		}
	}
	for _, in := range []string{"", "-1GiB", "GiB", "1TiB"} {
		if _, err := ParseBytes(in); err == nil {
			t.Errorf("ParseBytes(%q) accepted", in)
		}
	}
}

func TestParseChurn(t *testing.T) {
	got, err := ParseChurn("20s:-2, 40s:+2")
	want := []ChurnEvent{{At: 20 * time.Second, Server: 2, Leave: true}, {At: 40 * time.Second, Server: 2}}
	if err != nil || !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v, %v", got, err)
	}
	if got, err := ParseChurn(""); err != nil || got != nil {
		t.Errorf("empty schedule: %v %v", got, err)
	}
	for _, in := range []string{"20s", "20s:2", "x:-1", "1s:-a", "-1s:+0"} {
		if _, err := ParseChurn(in); err == nil {
			t.Errorf("ParseChurn(%q) accepted", in)
		}
	}
}
