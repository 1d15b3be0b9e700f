package scoring

// CandidateScore is one candidate's terms in the kv and approximate policies' cost, as an
// Explain call saw them.
type CandidateScore struct {
	Address string `json:"address"`
	// BlockSize is the block size the request was cut into for this endpoint.
	BlockSize int `json:"block_size"`
	// RequestBlocks is the request's full blocks at that size.
	RequestBlocks int `json:"request_blocks"`
	// OverlapBlocks is how many leading blocks the endpoint holds: from the index, or
	// predicted (Predicted true) when its events are not healthy or the policy is
	// approximate.
	OverlapBlocks int  `json:"overlap_blocks"`
	Predicted     bool `json:"predicted"`
	// PrefillBlocks, DecodeBlocks and ActiveRequests are the three cost terms before their
	// weights: prefill blocks still to compute if the request joins, the active block
	// footprint if it joins, and the endpoint's in-flight requests followed by the policy.
	PrefillBlocks  float64 `json:"prefill_blocks"`
	DecodeBlocks   float64 `json:"decode_blocks"`
	ActiveRequests int     `json:"active_requests"`
	// Cost is the weighted sum; lowest wins.
	Cost float64 `json:"cost"`
}

// Explanation is what a policy would do with a request, computed without routing it.
type Explanation struct {
	Policy string `json:"policy"`
	// Pick is the candidate of lowest cost (the first of equal ones; Pick breaks exact
	// ties at random, and samples when the temperature is above 0).
	Pick string `json:"pick"`
	// Ties counts the candidates sharing the lowest cost.
	Ties int `json:"ties"`
	// Sampled is true when the policy samples (temperature > 0): Pick is then only the
	// most likely choice.
	Sampled bool `json:"sampled,omitempty"`
	// Tokenized is false when the request had no token ids (scored by load alone).
	Tokenized bool `json:"tokenized"`
	// Kind is the kind Pick's decision would name (Decision.Kind) were Pick to choose
	// Pick: KindUntokenized, KindHit (Pick holds some leading blocks) or KindLoad.
	Kind       string           `json:"kind"`
	Candidates []CandidateScore `json:"candidates"`
}

// Explain scores req over candidates exactly as Pick would, but changes nothing: no
// pending state, no random draw, no resize of the predicted caches. For the debug view.
func (p *KV) Explain(req *Request, candidates []Endpoint) (Explanation, error) {
	return p.core.explain("kv", req, candidates)
}

// Explain scores req as Pick would without changing any state; see KV.Explain.
func (p *Approximate) Explain(req *Request, candidates []Endpoint) (Explanation, error) {
	return p.core.explain("approximate", req, candidates)
}

// Peek returns the candidate the next Pick would return, without advancing the counter.
func (p *RoundRobin) Peek(candidates []Endpoint) string {
	if len(candidates) == 0 {
		return ""
	}
	return candidates[p.next.Load()%uint64(len(candidates))].Address
}

func (c *kvCore) explain(policy string, req *Request, cands []Endpoint) (Explanation, error) {
	if len(cands) == 0 {
		return Explanation{}, ErrNoCandidates
	}
	n := len(cands)
	ex := Explanation{Policy: policy, Tokenized: req.TokenIDs != nil, Sampled: c.cfg.Temperature > 0,
		Candidates: make([]CandidateScore, n)}
	var keys []kvKeys
	predicted := make([]bool, n)
	overlaps := make([]int, n)
	if ex.Tokenized {
		for i := range cands {
			bs := c.blockSize(&cands[i])
			ex.Candidates[i].BlockSize = bs
			if keysFor(keys, bs) == nil {
				keys = append(keys, kvKeys{bs, req.Keys(bs, nil)})
			}
		}
		c.predicted(cands, predicted)
		if c.ix != nil {
			for _, g := range keys {
				var names []string
				var pos []int
				for i := range cands {
					if ex.Candidates[i].BlockSize == g.blockSize && !predicted[i] {
						names = append(names, cands[i].Address)
						pos = append(pos, i)
					}
				}
				if len(names) == 0 || len(g.keys) == 0 {
					continue
				}
				lead := c.ix.LeadingBlocks(g.keys, names, nil)
				for j, i := range pos {
					overlaps[i] = lead[j]
				}
			}
		}
	}

	c.mu.Lock()
	defer c.mu.Unlock()
	eps := make([]*kvEndpoint, n)
	shared := make(map[*kvEndpoint]int, n)
	for i := range cands {
		ep := c.eps[cands[i].Address]
		if ep == nil {
			ep = &kvEndpoint{blockSize: c.cfg.BlockSize}
		}
		eps[i] = ep
		if ex.Tokenized && predicted[i] && ep.lru != nil {
			overlaps[i] = ep.lru.leading(keysFor(keys, ex.Candidates[i].BlockSize))
		}
	}
	for _, g := range keys {
		for _, k := range g.keys {
			c.holders(k, func(h kvHolder) { shared[h.ep]++ })
		}
	}
	for i, ep := range eps {
		cs := &ex.Candidates[i]
		cs.Address = cands[i].Address
		cs.ActiveRequests = ep.requests
		cs.Predicted = ex.Tokenized && predicted[i]
		if ex.Tokenized {
			bs := float64(cs.BlockSize)
			k := keysFor(keys, cs.BlockSize)
			cs.RequestBlocks = len(k)
			cs.OverlapBlocks = overlaps[i]
			// shared counts this endpoint's active blocks among the request's keys; only
			// keys of the endpoint's own block size can be among them.
			sh := 0
			if ep.blockSize == cs.BlockSize {
				sh = shared[ep]
			}
			cs.PrefillBlocks = max(0, float64(ep.prefillTokens+len(req.TokenIDs))/bs-c.cfg.OverlapCredit*float64(overlaps[i]))
			cs.DecodeBlocks = float64(ep.activeBlocks + len(k) - sh)
		} else {
			cs.PrefillBlocks = float64(ep.prefillTokens) / float64(ep.blockSize)
			cs.DecodeBlocks = float64(ep.activeBlocks)
		}
		cs.Cost = c.cfg.PrefillLoadScale*cs.PrefillBlocks + cs.DecodeBlocks +
			c.cfg.DecodeActiveRequestWeight*float64(cs.ActiveRequests)
	}
	best := 0
	for i := range ex.Candidates {
		switch x, b := ex.Candidates[i].Cost, ex.Candidates[best].Cost; {
		case x < b:
			best, ex.Ties = i, 1
		case x == b:
			ex.Ties++
		}
	}
	ex.Pick = cands[best].Address
	ex.Kind = kvKind(ex.Tokenized, ex.Candidates[best].OverlapBlocks)
	return ex, nil
}
