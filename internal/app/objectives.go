package app

import (
	"encoding/json"
	"net/http"

	"github.com/kvrouter/kvrouter/config"
)

// serveDebugObjectives is GET /debug/objectives: where requests' priorities come from
// now ("inference_pool", "config" or "none"), the objectives known there with their
// priorities (those below 0 are sheddable), and the queue depth past which they are shed
// (0: never).
func (a *App) serveDebugObjectives(w http.ResponseWriter, _ *http.Request) {
	cfg := a.live.Load()
	out := struct {
		Source         string         `json:"source"`
		ShedQueueDepth int            `json:"shed_queue_depth"`
		Objectives     map[string]int `json:"objectives"`
	}{Source: "none", ShedQueueDepth: cfg.Limits.ShedQueueDepth, Objectives: map[string]int{}}
	switch o := a.objectives(cfg).(type) {
	case config.Objectives:
		out.Source, out.Objectives = "config", o
	case interface{ Objectives() map[string]int }:
		out.Source = "inference_pool"
		if m := o.Objectives(); m != nil {
			out.Objectives = m
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
