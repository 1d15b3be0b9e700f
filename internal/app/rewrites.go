package app

import (
	"encoding/json"
	"net/http"

	"github.com/kvrouter/kvrouter/rewrite"
)

// serveDebugRewrites is GET /debug/rewrites: where requests' model rewrites come from now
// ("inference_pool", "config" or "none"), the rewrites in force in precedence order
// (exact matches win over generic rules, then the earlier rewrite, then the earlier
// rule), and, from an InferencePool, the InferenceModelRewrites refused with why.
func (a *App) serveDebugRewrites(w http.ResponseWriter, _ *http.Request) {
	out := struct {
		Source   string            `json:"source"`
		Rewrites []rewrite.Rewrite `json:"rewrites"`
		Refused  map[string]string `json:"refused,omitempty"`
	}{Source: "none", Rewrites: []rewrite.Rewrite{}}
	r, err := a.rewrites(a.live.Load())
	switch r := r.(type) {
	case *rewrite.Table:
		out.Source, out.Rewrites = "config", r.Rewrites()
	case interface {
		Rewrites() ([]rewrite.Rewrite, map[string]string)
	}:
		out.Source = "inference_pool"
		if rws, refused := r.Rewrites(); rws != nil {
			out.Rewrites, out.Refused = rws, refused
		}
	}
	if err != nil { // the configuration in force was checked when loaded
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(out)
}
