package app

import (
	"encoding/json"
	"fmt"
	"net/http"
	"os"

	"github.com/kvrouter/kvrouter/peersync"
	"github.com/kvrouter/kvrouter/placement"
	"go.uber.org/zap"
)

// sharer is a policy whose view of the endpoints takes other replicas' in-flight
// state (placement.Policy).
type sharer interface {
	peersync.Source
	SetPeers(placement.PeerView)
}

// newReplicas connects the routing policy to its peer replicas when replicas.peers is
// set: the policy reads their load from the Replica, and the Node, run with the App,
// carries it. Policies that keep no per-request state (kv, random...) share nothing.
func (a *App) newReplicas() error {
	cfg := a.cfg.Replicas
	if !cfg.Enabled() {
		return nil
	}
	sp, ok := a.pols.Load().policy.(sharer)
	if !ok {
		a.log.Warn("replicas: peers configured, but the policy shares no state", zap.String("policy", a.cfg.Policy.Name))
		return nil
	}
	if cfg.Name == "" {
		h, err := os.Hostname()
		if err != nil {
			return fmt.Errorf("app: replicas.name unset and no host name: %w", err)
		}
		cfg.Name = h
	}
	m := peersync.NewMetrics(a.reg)
	a.replica = peersync.NewReplica(cfg.Name, uint64(a.now().UnixNano()), sp, cfg.Expiry, cfg.Interval, a.now, m)
	node, err := peersync.NewNode(cfg, a.replica, a.log.Named("peersync"), m, peersync.NodeOptions{})
	if err != nil {
		return fmt.Errorf("app: %w", err)
	}
	a.peers = node
	sp.SetPeers(a.replica)
	return nil
}

// serveDebugReplicas shows this replica's peers and the state it holds from each.
func (a *App) serveDebugReplicas(w http.ResponseWriter, _ *http.Request) {
	out := struct {
		Self    string               `json:"self"`
		Addr    string               `json:"addr"`
		Members []string             `json:"members"`
		Peers   []peersync.PeerState `json:"peers"`
	}{}
	if a.replica != nil {
		out.Self, out.Addr, out.Members, out.Peers = a.replica.Self(), a.peers.Addr(), a.peers.Members(), a.replica.Peers()
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
