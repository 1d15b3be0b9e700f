package placement

import (
	"fmt"
	"math"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/kvrouter/kvrouter/config/field"
)

// Config tunes the placement policy (see Policy). Loads are request counts:
// the router's own in-flight requests on an endpoint, or, when its scraped metrics are
// valid and say more, vLLM's running plus waiting requests (which include other router
// replicas' requests).
//
// A deployment sets six of the fields: MaxNumBatchedTokens (a fact about the engines),
// HoldMax, PrefixDepth, SharedLoad, Balance and MaxPrefixes. The others keep the values
// measured in docs/results-policy.md and docs/results-workloads.md, for experiments
// (placement/README.md says why each keeps its value); what the engines' metrics and
// the request say (block size, KV capacity, speed, prefix size) is read, not set.
type Config struct {
	// PrefixDepth is the block whose key names a request's prefix: the key of block
	// min(PrefixDepth, full blocks) - 1, i.e. the first PrefixDepth x block_size tokens.
	// Requests sharing those tokens share a placement. Default 4.
	PrefixDepth int `yaml:"prefix_depth"`
	// Saturated is the load at which an endpoint no longer takes replicas, spills or
	// diverts. Default 6.
	Saturated int `yaml:"saturated"`
	// ReplicaLoad is the load of the least-loaded holder at which the prefix takes a
	// replica on a less-loaded endpoint where it fits within Fill (evicting nothing live).
	// Default 1.
	ReplicaLoad int `yaml:"replica_load"`
	// SpillLoad is the load a prefix's least-loaded holder must reach before the prefix
	// spills to an endpoint where its blocks would evict other live prefixes; below it,
	// requests queue at the holder. Default 10.
	SpillLoad int `yaml:"spill_load"`
	// Fill is the share of an endpoint's KV capacity that live placements may take
	// before an extra replica placed there would evict other live prefixes; an idle
	// endpoint takes one past it when the copy is worth its miss (a hit saving a small
	// share of the prompt at a busy holder; Policy, rule 5). Default 0.5.
	Fill float64 `yaml:"fill"`
	// Headroom is the share of an endpoint's KV capacity its in-flight requests may
	// occupy (each active prefix once, plus every request's own blocks and OutputBlocks)
	// before a new request would wait there for blocks. A holder without room counts as
	// saturated. Default 1.
	Headroom float64 `yaml:"headroom"`
	// OutputBlocks, when > 0, is the output blocks every request counts for while it
	// decodes. Default 0: derived per request, half its expected output (its blocks are
	// allocated as it decodes), the expected output being the engines' measured mean
	// (vllm:request_generation_tokens) at most its max_tokens. An override for engines
	// that do not export the histogram.
	OutputBlocks int `yaml:"output_blocks"`
	// SpillOnFull spills (rule 4) as soon as the least-loaded holder has no KV room,
	// without waiting for SpillLoad, and records the new placement. Default false (the
	// recorded spills cascade; DivertOnFull moves the one request instead).
	SpillOnFull bool `yaml:"spill_on_full"`
	// DivertDeadline sends a request alone (placing nothing) to another candidate with
	// KV room when its prefill backlog at the chosen endpoint (uncached prompt tokens
	// ahead of and in the request, scaled by the endpoint's measured speed) exceeds one
	// engine step, MaxNumBatchedTokens plus a block, and the other would start it at
	// least twice as soon. Default true.
	DivertDeadline bool `yaml:"divert_deadline"`
	// DivertOnFull sends a request alone (placing nothing) to the candidate with KV room
	// that would start it soonest when the chosen endpoint has no KV room (vLLM would
	// queue it until blocks free up). Default true.
	DivertOnFull bool `yaml:"divert_on_full"`
	// DivertMisses sends a request alone to an idle candidate with KV room when the
	// chosen endpoint is busy and holds less than HolderShare of the prefix (it would
	// recompute the prefix behind other requests) and the idle one is faster (see
	// MissSpeedup). Default true.
	DivertMisses bool `yaml:"divert_misses"`
	// FasterCopies, with router replicas (SetPeers), gives a request whose chosen
	// holder is idle and holds its prefix to an idle endpoint without it that is faster
	// beyond noise (MissSpeedup), which takes a copy: one per prefix and one per
	// endpoint beyond its homes, where it leaves room for a request of each prefix
	// placed there. Default true.
	FasterCopies bool `yaml:"faster_copies"`
	// MissSpeedup is how much shorter an idle candidate's measured decode time must be,
	// as a share of the chosen endpoint's, to take a diverted miss. Default 0.85.
	MissSpeedup float64 `yaml:"miss_speedup"`
	// HolderShare is the share of a prefix's estimated blocks an endpoint must hold, per
	// the index, to count as holding it. Default 0.5.
	HolderShare float64 `yaml:"holder_share"`
	// ConfirmPicks is how many picks a replica may go unconfirmed by the index (KV events
	// lag) before it is taken for evicted and dropped. Default 32.
	ConfirmPicks int `yaml:"confirm_picks"`
	// Balance > 0 chooses a new prefix's home by capacity-weighted rendezvous hashing,
	// skipping endpoints whose home blocks would exceed Balance x their capacity share
	// of all home blocks (bounded load); 0 takes the endpoint with the least home blocks
	// per block of capacity. Default 0.
	Balance float64 `yaml:"balance"`
	// StickyHolders ranks holders whose load is below ReplicaLoad by rendezvous score
	// instead of wait, so that router replicas all use the same copy of a prefix while
	// it is not busy and duplicates die out. Default true (with 4 router replicas it
	// halves the cached-token loss; docs/results-policy.md).
	StickyHolders bool `yaml:"sticky_holders"`
	// AdoptAll adopts every endpoint the index shows holding HolderShare of a prefix as
	// a holder; by default only the one holding most of a prefix the router has no
	// placement for is adopted. Default true (measured better with router replicas).
	AdoptAll bool `yaml:"adopt_all"`
	// RehomeLost moves a prefix's home when the index shows that the home lost it (holds
	// less than HolderShare of it, with no request for it in flight there, from this
	// router or, per the scraped metrics, any other) and no other endpoint holds it: the
	// request missesInPrefill wherever it goes, so the prefix is recomputed where RehomeSlack says
	// and that endpoint becomes its home. Default true (N = 24: +1 to +4 points of
	// cached-token ratio at C = 8 and 16; docs/results-policy.md).
	RehomeLost bool `yaml:"rehome_lost"`
	// RehomeSlack chooses the new home of a lost prefix. 0: the endpoint with KV room of
	// least home blocks per block of capacity (the home stays put on ties). > 0 (at least
	// 1): among endpoints with KV room whose home share would stay within RehomeSlack x
	// the mean share, the one that would start the miss soonest (see RehomeLoadTokens), so
	// missesInPrefill move to fast, idle endpoints while homes stay near a capacity-weighted
	// partition. Default 1.4.
	RehomeSlack float64 `yaml:"rehome_slack"`
	// RehomeLoadTokens is what one in-flight request counts for, in prefill tokens, when
	// RehomeSlack ranks endpoints by start time: (prefill backlog + prompt tokens +
	// RehomeLoadTokens x load) x measured decode time. Default 600.
	RehomeLoadTokens int `yaml:"rehome_load_tokens"`
	// PreferHeld ranks a prefix's placements that the index shows holding it before those
	// that lost it (router replicas keep homes another replica moved). Default true.
	PreferHeld bool `yaml:"prefer_held"`
	// HoldMax > 0 lets a request wait at the router, in steps of HoldStep and for at
	// most HoldMax in all (Decision.Hold, Request.Held), instead of joining the
	// prefill of a miss: when the chosen endpoint holds the request's prefix, the
	// request's own uncached tokens there are fewer than HoldPrefillTokens, and the
	// endpoint is prefilling a request of at least HoldPrefillTokens uncached tokens that
	// has no first token yet. Joining would add the request's tokens to the miss's last
	// prefill chunk and delay its first token; held, it starts after it. A request the
	// endpoint has no KV room for is not held: it would join no prefill step but wait
	// for blocks in the engine's queue, where requests routed while it was held would
	// go ahead of it. A request that arrives less than HoldStep after the newest miss
	// there was routed joins it instead: held, it would start up to a hold step after
	// the miss's first token and become slower than the miss it protects. 0 disables.
	// Default 120ms (N = 24, C = 8: p99 TTFT 189 -> 170 ms; docs/results-policy.md); the
	// router bounds it again with limits.max_hold.
	HoldMax time.Duration `yaml:"hold_max"`
	// HoldStep is how long one hold lasts before the request is picked again. Default 5ms.
	HoldStep time.Duration `yaml:"hold_step"`
	// HoldPrefillTokens is the uncached prompt tokens that make an in-flight request a
	// miss worth waiting for, and a request short enough to hold (see HoldMax). Default
	// 600, between the reference's 339-token hit and 2,371-token miss: the derivations
	// measured (one step, the request's own tail, most of the prompt cached, a miss
	// being any longer prefill than the held request's) each lose the reference grid at
	// N = 24 (docs/results-workloads.md).
	HoldPrefillTokens int `yaml:"hold_prefill_tokens"`
	// MaxNumBatchedTokens is the engines' per-step token budget (vLLM's
	// --max-num-batched-tokens; not in its /metrics, vllm-project/vllm#18900): a
	// request may leave the endpoint holding its prefix (replica, spill, divert) only
	// when the prefill that adds fits in one step plus the backlog it skips there.
	// Default 2048, vLLM's (V1) default for its OpenAI server; it takes 8192 on GPUs of
	// 70 GiB or more other than A100 (e.g. H100): set it to the fleet's value. A fact
	// about the engines, not a trade-off: a per-model fact when models differ.
	MaxNumBatchedTokens int `yaml:"max_num_batched_tokens"`
	// LiveWindow is how many of the policy's own picks a placement stays live without
	// being used. Default 1024.
	LiveWindow int `yaml:"live_window"`
	// BlockSize is used for an endpoint whose scraped block size is unknown: the served
	// model's models.*.block_size, set by the runner (policy.Deps.BlockSize), not a knob
	// of its own. Default 16 (vLLM's).
	BlockSize int `yaml:"-"`
	// DefaultBlocks is the KV capacity assumed for an endpoint whose num_gpu_blocks is
	// unknown. Default 4096.
	DefaultBlocks int `yaml:"default_blocks"`
	// MaxPrefixes bounds the placement table; beyond it the least recently seen prefixes
	// are dropped. Default 65536.
	MaxPrefixes int `yaml:"max_prefixes"`
	// ScrapedLoad takes an endpoint's load as the larger of the router's in-flight count
	// and its scraped running plus waiting requests, and its KV use as the larger of the
	// footprint and the scraped usage: for several router replicas, each seeing only its
	// own requests. Stale by the scrape interval, so off by default (false).
	ScrapedLoad bool `yaml:"scraped_load"`
	// SharedLoad adds other routers' requests to an endpoint's load and their KV blocks
	// to its footprint, for router replicas that each see only their own requests: the
	// scraped running plus waiting requests and KV usage beyond this router's own at the
	// time of the scrape (Metrics.At; the policy keeps a short history of its own counts).
	// With one router that is zero, so nothing changes. Ignored when ScrapedLoad is on.
	SharedLoad bool `yaml:"shared_load"`
	// UnplaceDiverted drops the replica or spill placement a pick has just made when the
	// request itself is then diverted elsewhere (DivertDeadline, DivertOnFull,
	// DivertMisses): no request would ever fill it, and until ConfirmPicks drops it the
	// unfilled placement counts as a holder, which keeps that endpoint from taking a
	// replica. Default true (churn: 3 losses against kv to 0 over 9 repetitions;
	// docs/results-policy.md).
	UnplaceDiverted bool `yaml:"unplace_diverted"`
	// LongContexts keeps long prompts' histories and ranks long misses by measured
	// prefill speed: a long miss (more than 1/(1-MissSpeedup) engine steps uncached)
	// goes, alone, placing nothing, where its prefill plus the recent long prompts it
	// evicts take least time at measured prefill speed (each endpoint's turnover: the
	// blocks the router sent there since, against its num_gpu_blocks); and a
	// conversation's turn sent while its last request is still in prefill goes where
	// that request is. Default true.
	LongContexts bool `yaml:"long_contexts"`
	// CopyCost judges a busy holder's replica of a shared prefix within Fill by its
	// worth, not only by room: once the prefix is on as many endpoints as its share of
	// the requests in flight times the endpoints, a further copy must cost less than the
	// hit (the request's uncached tokens, plus the prefill backlog, times the requests
	// running there and itself) or go to an endpoint measured faster beyond noise
	// (MissSpeedup); a refused copy's request goes to the holder that starts it soonest.
	// Fill says only whether a copy evicts something live, and with KV memory to spare
	// it never binds. Default true (80 GiB per server, N = 24, C = 16: cached-token ratio
	// 0.464 -> 0.686, kv 0.593; docs/results-workloads.md, held-out).
	CopyCost bool `yaml:"copy_cost"`
}

// DefaultConfig returns the defaults measured in docs/results-policy.md.
func DefaultConfig() Config {
	return Config{
		PrefixDepth:         4,
		Saturated:           6,
		SpillLoad:           10,
		ReplicaLoad:         1,
		Fill:                0.5,
		Headroom:            1,
		OutputBlocks:        0,
		SpillOnFull:         false,
		DivertDeadline:      true,
		DivertOnFull:        true,
		DivertMisses:        true,
		FasterCopies:        true,
		HolderShare:         0.5,
		LiveWindow:          1024,
		ConfirmPicks:        32,
		AdoptAll:            true,
		StickyHolders:       true,
		MissSpeedup:         0.85,
		BlockSize:           16,
		DefaultBlocks:       4096,
		MaxPrefixes:         65536,
		ScrapedLoad:         false,
		RehomeLost:          true,
		RehomeSlack:         1.4,
		RehomeLoadTokens:    600,
		PreferHeld:          true,
		HoldMax:             120 * time.Millisecond,
		HoldStep:            5 * time.Millisecond,
		HoldPrefillTokens:   600,
		UnplaceDiverted:     true,
		LongContexts:        true,
		CopyCost:            true,
		MaxNumBatchedTokens: 2048,
	}
}

// Validate reports every invalid field, each with its YAML name as the path.
func (c Config) Validate() error {
	var errs field.Errors
	pos := func(name string, v int) {
		if v <= 0 {
			errs.Addf(name, "must be > 0, got %d", v)
		}
	}
	pos("prefix_depth", c.PrefixDepth)
	pos("saturated", c.Saturated)
	pos("spill_load", c.SpillLoad)
	pos("replica_load", c.ReplicaLoad)
	pos("live_window", c.LiveWindow)
	pos("confirm_picks", c.ConfirmPicks)
	pos("default_blocks", c.DefaultBlocks)
	pos("max_prefixes", c.MaxPrefixes)
	pos("hold_prefill_tokens", c.HoldPrefillTokens)
	pos("max_num_batched_tokens", c.MaxNumBatchedTokens)
	if c.BlockSize <= 0 {
		errs.Addf("", "block size must be > 0, got %d", c.BlockSize)
	}
	share := func(name string, v float64) {
		if math.IsNaN(v) || v <= 0 || v > 1 {
			errs.Addf(name, "must be in (0, 1], got %v", v)
		}
	}
	share("fill", c.Fill)
	share("holder_share", c.HolderShare)
	share("headroom", c.Headroom)
	if math.IsNaN(c.Balance) || c.Balance < 0 || (c.Balance > 0 && c.Balance < 1) {
		errs.Addf("balance", "must be 0 or >= 1, got %v", c.Balance)
	}
	if math.IsNaN(c.MissSpeedup) || c.MissSpeedup <= 0 {
		errs.Addf("miss_speedup", "must be > 0, got %v", c.MissSpeedup)
	}
	if math.IsNaN(c.RehomeSlack) || c.RehomeSlack < 0 || (c.RehomeSlack > 0 && c.RehomeSlack < 1) {
		errs.Addf("rehome_slack", "must be 0 or >= 1, got %v", c.RehomeSlack)
	}
	if c.RehomeLoadTokens < 0 {
		errs.Addf("rehome_load_tokens", "must be >= 0, got %d", c.RehomeLoadTokens)
	}
	if c.HoldMax < 0 {
		errs.Addf("hold_max", "must be >= 0, got %v", c.HoldMax)
	}
	if c.HoldStep <= 0 || c.HoldStep > time.Second {
		errs.Addf("hold_step", "must be in (0, 1s], got %v", c.HoldStep)
	}
	if c.OutputBlocks < 0 {
		errs.Addf("output_blocks", "must be >= 0, got %d", c.OutputBlocks)
	}
	if c.SpillLoad < c.Saturated && c.Saturated > 0 && c.SpillLoad > 0 {
		errs.Addf("spill_load", "%d must be >= saturated (%d)", c.SpillLoad, c.Saturated)
	}
	return errs.Err()
}

// ParseKnob sets the field with that YAML name from text parsed by the field's type
// (strconv.Atoi, ParseFloat, ParseBool, time.ParseDuration), for command-line
// overrides (kvbench --placement); the configuration file is decoded by package config.
func (c *Config) ParseKnob(name, text string) error {
	v := reflect.ValueOf(c).Elem()
	f, ok := knobField(v.Type(), name)
	if !ok {
		return fmt.Errorf("placement: unknown knob %q (known: %s)", name, strings.Join(KnobNames(), ", "))
	}
	fv := v.Field(f)
	if fv.Type() == reflect.TypeFor[time.Duration]() {
		d, err := time.ParseDuration(text)
		if err != nil {
			return fmt.Errorf("placement: %s: %w", name, err)
		}
		fv.SetInt(int64(d))
		return nil
	}
	var err error
	switch fv.Kind() {
	case reflect.Int:
		var i int
		i, err = strconv.Atoi(text)
		fv.SetInt(int64(i))
	case reflect.Float64:
		var x float64
		x, err = strconv.ParseFloat(text, 64)
		fv.SetFloat(x)
	case reflect.Bool:
		var b bool
		b, err = strconv.ParseBool(text)
		fv.SetBool(b)
	default:
		err = fmt.Errorf("unsupported type %s", fv.Type())
	}
	if err != nil {
		return fmt.Errorf("placement: %s: %w", name, err)
	}
	return nil
}

// KnobNames lists the YAML names of the user-facing fields, sorted.
func KnobNames() []string {
	t := reflect.TypeFor[Config]()
	var out []string
	for i := range t.NumField() {
		if n := t.Field(i).Tag.Get("yaml"); n != "-" && n != "" {
			out = append(out, n)
		}
	}
	slices.Sort(out)
	return out
}

func knobField(t reflect.Type, name string) (int, bool) {
	for i := range t.NumField() {
		if n := t.Field(i).Tag.Get("yaml"); n == name && n != "-" {
			return i, true
		}
	}
	return 0, false
}
