// Package kvsink feeds the block index from decoded vLLM KV events: it is the adapter
// between kvevents (transport and decoding) and index (which knows nothing of either).
// Imports run kvsink -> kvevents and kvsink -> index only.
//
// Concurrency: a Sink is safe for concurrent use; calls for one (endpoint, rank) must
// come in stream order, which the subscriber guarantees.
package kvsink

import (
	"fmt"
	"slices"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/kvrouter/kvrouter/index"
	"github.com/kvrouter/kvrouter/kvevents"
)

// Config chooses which events reach the index.
type Config struct {
	// Media lists the storage media whose blocks are indexed. vLLM reports "GPU" (or
	// nothing) for its own cache; offloading connectors report "CPU" and others, which a
	// request does not hit at GPU speed. Default: "" and "GPU".
	Media []string `yaml:"media"`
	// Group is the KV-cache group indexed, for hybrid models whose groups each report the
	// same blocks; the others are skipped so a block is not counted once per group.
	// Default 0.
	Group int `yaml:"group"`
}

// DefaultConfig indexes GPU blocks of group 0.
func DefaultConfig() Config { return Config{Media: []string{"", "GPU"}} }

// Validate reports an invalid configuration.
func (c Config) Validate() error {
	if len(c.Media) == 0 {
		return fmt.Errorf("kvsink: media must list at least one medium")
	}
	if c.Group < 0 {
		return fmt.Errorf("kvsink: group must be >= 0, got %d", c.Group)
	}
	return nil
}

// Sink applies kvevents batches to an index. It implements the subscriber's Sink.
type Sink struct {
	ix      *index.Index
	model   func(endpoint string) string
	cfg     Config
	skipped *prometheus.CounterVec
}

// New returns a Sink writing to ix. model names the base model an endpoint serves,
// exactly as requests name it (scoring.Request.BaseModel): it roots the block keys, so a
// mismatch means no request ever matches that endpoint's blocks. A batch that names its
// model (Batch.Model, from a central-mode topic) is keyed under that name instead. reg
// may be nil.
func New(ix *index.Index, model func(endpoint string) string, cfg Config, reg prometheus.Registerer) (*Sink, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if ix == nil || model == nil {
		return nil, fmt.Errorf("kvsink: index and model are required")
	}
	s := &Sink{ix: ix, model: model, cfg: cfg, skipped: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "kvrouter_kvsink_skipped_events_total",
		Help: "KV events not applied to the index, by reason (medium, group, lora_id_only).",
	}, []string{"reason"})}
	if reg != nil {
		reg.MustRegister(s.skipped)
	}
	return s, nil
}

func (s *Sink) wanted(medium string, group int) (string, bool) {
	if !slices.Contains(s.cfg.Media, medium) {
		return "medium", false
	}
	if group != s.cfg.Group {
		return "group", false
	}
	return "", true
}

// Apply applies a batch's events in order. Orphans and malformed events are counted by
// the index and skipped; the rest of the batch is applied. The batch is not retained.
func (s *Sink) Apply(endpoint string, rank int, b *kvevents.Batch) {
	if b == nil {
		return
	}
	// A central-mode topic names the model; otherwise the endpoint's is looked up.
	model := b.Model
	if model == "" {
		model = s.model(endpoint)
	}
	for _, ev := range b.Events {
		switch e := ev.(type) {
		case *kvevents.BlockStored:
			if reason, ok := s.wanted(e.Medium, e.GroupIdx); !ok {
				s.skipped.WithLabelValues(reason).Inc()
				continue
			}
			lora := e.LoRAName
			if lora == "" && e.HasLoRAID {
				// An adapter known only by number: key it apart so it matches no request
				// rather than base-model requests.
				lora = fmt.Sprintf("\x00lora-id:%d", e.LoRAID)
				s.skipped.WithLabelValues("lora_id_only").Inc()
			}
			// cache_salt rides in the first block's extra_keys; the root only matters
			// for a block without a parent, which is the only one that can carry it.
			salt, _ := e.CacheSalt()
			_ = s.ix.Store(endpoint, rank, index.Blocks{
				Root:      index.Root(model, lora, salt),
				Parent:    e.ParentHash,
				HasParent: e.HasParent,
				Handles:   e.BlockHashes,
				Tokens:    e.TokenIDs,
				BlockSize: e.BlockSize,
			})
		case *kvevents.BlockRemoved:
			if reason, ok := s.wanted(e.Medium, e.GroupIdx); !ok {
				s.skipped.WithLabelValues(reason).Inc()
				continue
			}
			s.ix.Remove(endpoint, rank, e.BlockHashes)
		case *kvevents.AllBlocksCleared:
			s.ix.Clear(endpoint, rank)
		}
	}
}

// Clear drops everything indexed for the endpoint's rank.
func (s *Sink) Clear(endpoint string, rank int) { s.ix.Clear(endpoint, rank) }
