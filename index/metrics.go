package index

import "github.com/prometheus/client_golang/prometheus"

// metrics are the index's Prometheus series. Counters are added once per call, never per
// block, so they stay off the per-block path.
type metrics struct {
	stored          prometheus.Counter
	removed         prometheus.Counter
	orphans         prometheus.Counter
	evicted         prometheus.Counter
	unknownRemovals prometheus.Counter
	conflicts       prometheus.Counter
	rejected        *prometheus.CounterVec
	clears          prometheus.Counter
	purges          prometheus.Counter
}

func newMetrics(reg prometheus.Registerer, ix *Index) *metrics {
	c := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help})
	}
	m := &metrics{
		stored:          c("kvrouter_index_blocks_stored_total", "Blocks added to the index from BlockStored events (duplicates included)."),
		removed:         c("kvrouter_index_blocks_removed_total", "Block references removed by BlockRemoved events."),
		orphans:         c("kvrouter_index_orphan_blocks_total", "Blocks of BlockStored events whose parent handle was unknown, not indexed."),
		evicted:         c("kvrouter_index_evicted_blocks_total", "Blocks dropped, oldest first, because an endpoint rank exceeded its capacity."),
		unknownRemovals: c("kvrouter_index_unknown_removals_total", "BlockRemoved handles the index did not hold."),
		conflicts:       c("kvrouter_index_handle_conflicts_total", "Stores of a known handle whose tokens gave a different key than the first store (first key kept)."),
		rejected: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "kvrouter_index_rejected_events_total",
			Help: "Store calls rejected as malformed, by reason.",
		}, []string{"reason"}),
		clears: c("kvrouter_index_clears_total", "Endpoint ranks cleared (AllBlocksCleared, gaps, restarts)."),
		purges: c("kvrouter_index_purges_total", "Endpoints purged from the index."),
	}
	if reg == nil {
		return m
	}
	reg.MustRegister(m.stored, m.removed, m.orphans, m.evicted, m.unknownRemovals, m.conflicts,
		m.rejected, m.clears, m.purges,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvrouter_index_blocks",
			Help: "Blocks held, summed over endpoint ranks.",
		}, func() float64 { return float64(ix.blocks.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvrouter_index_keys",
			Help: "Distinct block keys held by at least one endpoint rank.",
		}, func() float64 { return float64(ix.keys.Load()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{
			Name: "kvrouter_index_endpoints",
			Help: "Endpoints known to the index.",
		}, func() float64 { return float64(ix.endpointCount.Load()) }),
	)
	return m
}
