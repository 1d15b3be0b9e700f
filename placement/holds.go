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
	// Joined now, the request would share the miss's last prefill step; held, it starts
	// up to a hold step after the miss's first token. Without KV room there it shares
	// no step: it waits in the engine's queue for blocks, first come first served,
	// behind the requests queued before it, and a hold only lets the requests routed
	// meanwhile go ahead of it (tight memory, 32 clients: every slow request had been
	// held the whole HoldMax while up to three others were sent to its endpoint; p99
	// TTFT 4,753 -> 4,121 ms, kv 4,053; docs/results-workloads.md, held-out). When the
	// newest miss there was routed less than a hold step before this request arrived
	// (req.Held ago), the held request would become slower than the miss it protects:
	// it joins instead (12 servers, C = 16: p99 TTFT 153 -> 143 ms, kv 143). Misses
	// only a peer routed carry no time: held, as before.
	if !sc.room[best] {
		return 0
	}
	ep := sc.eps[best]
	if ep.missesInPrefill > 0 && p.now().Sub(ep.lastMiss) < req.Held+step {
		return 0
	}
	return step
}

// missSooner returns the candidate a request behind a miss in prefill at best (a hit
// held there, or a new prefix's first request homed there, or homed beside any prefill
// there, a hit's short tail included, once every endpoint's decode time is measured)
// goes to instead, as a miss of its own, or -1; the caller asks only while speeds are even (scratch.even): on the
// reference's uneven fleet it moved hits off their holders as misses (N = 24, C = 16:
// 0.951 -> 0.899 times the partition's ratio). The candidate is an endpoint with room
// and no prefill in progress (decoding ones too: a new prefix homed at 0.65 s beside a
// miss while every endpoint decoded kept the uniform fleet's N = 24, C = 8 at 150 ms)
// where the request's uncached tokens there take less time than it would wait at best:
// best's prefill backlog plus the request's own uncached tokens, less the time since the
// newest miss there was routed (with none, the newest request with uncached tokens).
// A hit's tail is no miss to hold behind, but a miss homed beside it shares its steps:
// the tail fills part of the miss's first step and pushes its first token back a step's
// share (8 servers, N = 24, C = 8, where clients finishing together send their requests
// at once and a new prefix was homed beside a hit just routed while endpoints idled:
// TTFT p99 143 -> 132 ms, kv 129; docs/results-workloads.md, held-out). Before every
// endpoint is measured the reference's fleet (0.7 and full speed) looks even, and homes
// moved so lost N = 24, C = 16 (0.951 -> 0.944 times the partition's ratio). Times are at each endpoint's measured prefill speed for
// prompts of that size, the slowest measured where it is not measured (an unknown
// endpoint is not assumed fast). p.mu must be held.
func (p *Policy) missSooner(cands []scoring.Endpoint, sc *scratch, best, tokens, bs int) int {
	spt := sc.prefillSecsPerToken
	ep := sc.eps[best]
	own := max(0, tokens-sc.lead[best]*bs)
	sb := spt(best, max(ep.prefill, own))
	if sb == 0 {
		return -1
	}
	n := ep.prefill + own
	since := ep.lastMiss
	if ep.missesInPrefill == 0 {
		since = ep.lastPrefill
	}
	rest := float64(n)*sb - p.now().Sub(since).Seconds()
	alt, ea := -1, rest
	for i := range cands {
		if i == best || !sc.ok[i] || sc.eps[i].prefill+sc.otherPrefill[i] > 0 {
			continue
		}
		m := max(0, tokens-sc.lead[i]*bs)
		if x := float64(m) * spt(i, m); x > 0 && (x < ea || alt >= 0 && x == ea && sc.loads[i] < sc.loads[alt]) {
			alt, ea = i, x
		}
	}
	return alt
}

// prefillEnds is when a request of tokens would get its first token at candidate i
// behind backlog prefill tokens there: the backlog, then its tokens i does not hold, at
// i's measured prefill speed for that many (prefillSecsPerToken), in seconds; 0 when no
// candidate has a speed measured for that size.
func (sc *scratch) prefillEnds(i, backlog, tokens int) float64 {
	n := backlog + max(0, tokens-sc.lead[i]*sc.blockSize)
	return float64(n) * sc.prefillSecsPerToken(i, n)
}

// prefillSecsPerToken is candidate i's measured prefill time per token for prompts of n
// tokens or, where i has none measured for that size, the slowest measured candidate's
// (an unknown endpoint is not assumed fast); 0 when no candidate has one.
func (sc *scratch) prefillSecsPerToken(i, n int) float64 {
	c := prefillClass(n)
	if m := sc.eps[i].prefillSpeed[c]; m.tokens > 0 {
		return m.secs / m.tokens
	}
	slowest := 0.0
	for _, ep := range sc.eps {
		if m := ep.prefillSpeed[c]; m.tokens > 0 {
			slowest = max(slowest, m.secs/m.tokens)
		}
	}
	return slowest
}
