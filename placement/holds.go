package placement

import (
	"time"

	"github.com/kvrouter/kvrouter/scoring"
)

// waitBehindMiss returns how long the request should wait at the router before it is
// picked again (0: route it now): see Config.HoldMax. p.mu must be held.
func (p *Policy) waitBehindMiss(req *scoring.Request, e *prefixEntry, key uint64, sc *scratch, best, bs int) time.Duration {
	hold, _ := p.behindMiss(req, e, key, sc, best, bs)
	return hold
}

// behindMiss returns waitBehindMiss's hold, and whether the request, routed to best
// now, joins a miss in prefill there (a hit that arrived less than a hold step after
// the miss was routed). p.mu must be held.
func (p *Policy) behindMiss(req *scoring.Request, e *prefixEntry, key uint64, sc *scratch, best, bs int) (time.Duration, bool) {
	if p.cfg.HoldMax <= 0 || sc.eps[best].missesInPrefill+sc.otherMisses[best] == 0 {
		return 0, false
	}
	step := p.cfg.HoldStep
	if req.Held+step > p.cfg.HoldMax {
		return 0, false
	}
	// The endpoint holds the prefix, or is computing it now (the index shows it later).
	have := sc.lead[best]
	if a := sc.eps[best].active[key]; a != nil {
		have = max(have, a.blocks)
	}
	if have < e.held(p.cfg.HolderShare) || len(req.TokenIDs)-have*bs >= p.cfg.HoldPrefillTokens {
		return 0, false
	}
	// Joined now, the request would share the miss's last prefill step; held, it starts
	// up to a hold step after the miss's first token. When the newest miss there was
	// routed less than a hold step before this request arrived (req.Held ago), the held
	// request would become slower than the miss it protects: it joins instead (12
	// servers, C = 16: p99 TTFT 153 -> 143 ms, kv 143; docs/results-workloads.md). Without
	// KV room there, joined, it would wait in the engine for blocks anyway: it is held.
	// Misses only a peer routed carry no time: held, as before.
	ep := sc.eps[best]
	if ep.missesInPrefill > 0 && sc.room[best] && p.now().Sub(ep.lastMiss) < req.Held+step {
		return 0, true
	}
	return step, false
}

// aloneMiss returns the candidate a request that would join a miss in prefill at best
// (behindMiss) goes to instead, alone, or -1: an idle candidate with no prefill in
// progress and room for the request and its prefix beside its live placements and
// requests (spare: it evicts nothing live), where the request's uncached tokens are no
// more than best's prefill backlog. Its prefill there then ends no later than the
// backlog it would wait for at best, and joined it would push the miss's first token
// back too: both share the miss's last step (8 servers, N = 24, C = 8: a cold start's
// new prefixes' first and second requests took 143 ms to their first token, a lone
// miss 129; docs/results-workloads.md, held-out). Of those, the one that starts it
// soonest. A long prompt (more than 1/(1-MissSpeedup) steps) stays: the step it adds
// to the miss is within the noise of a prefill that long, and a second agent on a
// context in prefill would recompute it (the long-context rules). p.mu must be held.
func (p *Policy) aloneMiss(key uint64, cands []scoring.Endpoint, sc *scratch, best, tokens, bs int) int {
	if p.long(tokens) {
		return -1
	}
	alt := -1
	for i := range cands {
		if i == best || !sc.ok[i] || sc.loads[i] > 0 || sc.eps[i].prefill+sc.otherPrefill[i] > 0 ||
			max(0, tokens-sc.lead[i]*bs) > sc.eps[best].prefill || !p.spare(key, cands, sc, i) {
			continue
		}
		if alt < 0 || p.startEst(sc, i, tokens, bs) < p.startEst(sc, alt, tokens, bs) {
			alt = i
		}
	}
	return alt
}
