package app_test

import (
	"encoding/json"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/internal/app"
	"github.com/kvrouter/kvrouter/internal/testwait"
)

// debugReplicas is GET /debug/replicas.
type debugReplicas struct {
	Self    string     `json:"self"`
	Addr    string     `json:"addr"`
	Members []string   `json:"members"`
	Peers   []peerJSON `json:"peers"`
}

type peerJSON struct {
	Name string `json:"name"`
	Live bool   `json:"live"`
}

func getReplicas(t *testing.T, a *runningApp) debugReplicas {
	t.Helper()
	code, body := httpGet(t, "http://"+a.addrs.Debug+"/debug/replicas")
	var d debugReplicas
	if code != 200 || json.Unmarshal([]byte(body), &d) != nil {
		t.Fatalf("/debug/replicas: %d %s", code, body)
	}
	return d
}

// TestReplicasFindEachOther runs two kvrouters on loopback, the second listing the
// first as its peer: both see the other as a member and a live peer.
func TestReplicasFindEachOther(t *testing.T) {
	vllm := newFakeVLLM(t)
	cfgA := testConfig(t, vllm)
	cfgA.Replicas.Name, cfgA.Replicas.Bind = "kvrouter-a", "127.0.0.1:0"
	cfgA.Replicas.Peers = []string{"127.0.0.1:9"} // nobody there: a starts alone
	cfgA.Replicas.Expiry = time.Minute            // no timing in this test
	a := startApp(t, cfgA, app.Options{Registry: prometheus.NewRegistry()})
	var addrA string
	testwait.For(t, "a's gossip address", func() bool { addrA = getReplicas(t, a).Addr; return addrA != "" })

	cfgB := testConfig(t, vllm)
	cfgB.Replicas.Name, cfgB.Replicas.Bind, cfgB.Replicas.Peers = "kvrouter-b", "127.0.0.1:0", []string{addrA}
	cfgB.Replicas.Expiry = time.Minute
	b := startApp(t, cfgB, app.Options{Registry: prometheus.NewRegistry()})

	for _, c := range []struct {
		r    *runningApp
		peer string
	}{{a, "kvrouter-b"}, {b, "kvrouter-a"}} {
		testwait.For(t, "each replica to see the other live", func() bool {
			d := getReplicas(t, c.r)
			live := slices.ContainsFunc(d.Peers, func(p peerJSON) bool { return p.Name == c.peer && p.Live })
			return slices.Contains(d.Members, c.peer) && live
		})
	}
}
