package placement

import (
	"time"

	"github.com/kvrouter/kvrouter/scoring"
)

// waitBehindMiss returns how long the request should wait at the router before it is
// picked again (0: route it now): see Config.HoldMax. p.mu must be held.
func (p *Policy) waitBehindMiss(req *scoring.Request, e *prefixEntry, key uint64, sc *scratch, best, bs int) time.Duration {
	if p.cfg.HoldMax <= 0 || sc.eps[best].missesInPrefill+sc.otherMisses[best] == 0 {
		return 0
	}
	step := p.cfg.HoldStep
	if req.Held+step > p.cfg.HoldMax {
		return 0
	}
	// The endpoint holds the prefix, or is computing it now (the index shows it later).
	have := sc.lead[best]
	if a := sc.eps[best].active[key]; a != nil {
		have = max(have, a.blocks)
	}
	if have < e.held(p.cfg.HolderShare) || len(req.TokenIDs)-have*bs >= p.cfg.HoldPrefillTokens {
		return 0
	}
	return step
}
