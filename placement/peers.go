package placement

// Load is what other router replicas have in flight on one endpoint: their requests,
// the KV blocks those requests hold (each prefix once, none that this router has active
// there itself), the uncached prompt tokens of those without a first token, and how
// many of them are misses of at least HoldPrefillTokens.
type Load struct {
	Requests int
	KVBlocks int
	Prefill  int
	Misses   int
}

// EndpointLoad is one router's own in-flight load on one endpoint, as it shares it:
// Load with KVBlocks counting each request's own blocks only, and the prefixes its
// requests there share, each with its blocks (counted once however many routers use it).
type EndpointLoad struct {
	Endpoint string
	Load
	Active []ActivePrefix
}

// ActivePrefix is a prefix some in-flight request on an endpoint uses, by the key that
// names it (Config.PrefixDepth), with its estimated blocks.
type ActivePrefix struct {
	Key    uint64
	Blocks int
}

// ActiveSet tells which prefixes this router has active on an endpoint.
type ActiveSet interface {
	Active(key uint64) bool
}

// PeerView is the other router replicas' in-flight load per endpoint, as this replica
// last heard it (package peersync). Pick calls it under the policy's lock, once per
// candidate, with the candidate's own active prefixes (not to count their blocks twice):
// it must answer from memory and never wait on the network.
type PeerView interface {
	PeerLoad(endpoint string, local ActiveSet) Load
	// PeerActive reports whether a peer has a request using the prefix named key in
	// flight on endpoint: the endpoint holds it, or is computing it, so the prefix is
	// adopted there as the index's holders are, before its KV events arrive.
	PeerActive(endpoint string, key uint64) bool
}

// SetPeers makes every later Pick add peers' load to its own view of each endpoint: to
// its load (requests), its KV room, its prefill backlog (diverts, rehoming) and the
// misses a hit is held behind. It replaces SharedLoad's estimate from scraped metrics.
// nil turns it off.
func (p *Policy) SetPeers(v PeerView) {
	p.mu.Lock()
	p.peers = v
	p.mu.Unlock()
}

// Local appends this router's own in-flight load on every endpoint where it has some
// (what its peers need) to dst, and returns it. The Active slices are fresh.
func (p *Policy) Local(dst []EndpointLoad) []EndpointLoad {
	p.mu.Lock()
	defer p.mu.Unlock()
	for addr, ep := range p.eps {
		if ep.inflight == 0 && ep.footprint == 0 && ep.prefill == 0 {
			continue
		}
		l := EndpointLoad{Endpoint: addr, Load: Load{
			Requests: ep.inflight, KVBlocks: ep.footprint, Prefill: ep.prefill, Misses: ep.missesInPrefill,
		}}
		if len(ep.active) > 0 {
			l.Active = make([]ActivePrefix, 0, len(ep.active))
			for k, a := range ep.active {
				l.Active = append(l.Active, ActivePrefix{Key: k, Blocks: a.blocks})
				l.KVBlocks -= a.blocks
			}
		}
		dst = append(dst, l)
	}
	return dst
}

// Active reports whether the endpoint has an in-flight request of this router using
// the prefix named key (ActiveSet). p.mu must be held.
func (ep *endpointState) Active(key uint64) bool { return ep.active[key] != nil }
