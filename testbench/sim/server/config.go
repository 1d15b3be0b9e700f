package server

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"

	"github.com/kvrouter/kvrouter/kvevents"
	"github.com/kvrouter/kvrouter/testbench/sim"
)

// KVEventsConfig is vLLM's --kv-events-config JSON, plus two fields of our own that pick
// between wire variants seen in the field.
type KVEventsConfig struct {
	EnableKVCacheEvents bool   `json:"enable_kv_cache_events"`
	Publisher           string `json:"publisher"`
	Endpoint            string `json:"endpoint"`
	ReplayEndpoint      string `json:"replay_endpoint"`
	Topic               string `json:"topic"`
	BufferSteps         int    `json:"buffer_steps"`
	HWM                 int    `json:"hwm"`
	MaxQueueSize        int    `json:"max_queue_size"`
	// Encoding is "array" (vLLM up to 0.23) or "map" (since PR 42892). Not a vLLM field.
	Encoding string `json:"encoding"`
	// ReplayFraming is "topic" (vLLM >= 0.26: ["", topic, seq, payload]) or "legacy"
	// (["", seq, payload]). Not a vLLM field.
	ReplayFraming string `json:"replay_framing"`
	// Bind binds the PUB socket on Endpoint's own host (for instance 127.0.0.1) instead
	// of connecting to it; vLLM binds only when the host is "*". Not a vLLM field.
	Bind bool `json:"bind"`
}

// DefaultKVEventsConfig is vLLM's defaults (events off, zmq on tcp://*:5557, 10,000
// buffered steps, HWM 100,000) with the map encoding of current vLLM.
func DefaultKVEventsConfig() KVEventsConfig {
	return KVEventsConfig{Publisher: "zmq", Endpoint: "tcp://*:5557", BufferSteps: 10000,
		HWM: 100000, MaxQueueSize: 100000, Encoding: "map", ReplayFraming: "topic"}
}

// ParseKVEventsConfig reads the flag's JSON over the defaults; unknown keys are errors,
// as vLLM's config parsing rejects them.
func ParseKVEventsConfig(s string) (KVEventsConfig, error) {
	c := DefaultKVEventsConfig()
	if strings.TrimSpace(s) == "" {
		return c, nil
	}
	dec := json.NewDecoder(strings.NewReader(s))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return c, fmt.Errorf("server: --kv-events-config: %w", err)
	}
	return c, c.Validate()
}

// Validate reports the first invalid field.
func (c KVEventsConfig) Validate() error {
	if !c.EnableKVCacheEvents {
		return nil
	}
	switch {
	case c.Publisher != "zmq" && c.Publisher != "null":
		return fmt.Errorf("server: kv events publisher %q: only \"zmq\" and \"null\" are supported", c.Publisher)
	case c.Publisher == "zmq" && !strings.HasPrefix(c.Endpoint, "tcp://") && !strings.HasPrefix(c.Endpoint, "ipc://"):
		return fmt.Errorf("server: kv events endpoint %q: want tcp://host:port", c.Endpoint)
	case c.Encoding != "array" && c.Encoding != "map":
		return fmt.Errorf("server: kv events encoding %q: want array or map", c.Encoding)
	case c.ReplayFraming != "topic" && c.ReplayFraming != "legacy":
		return fmt.Errorf("server: replay framing %q: want topic or legacy", c.ReplayFraming)
	case c.BufferSteps < 0:
		return errors.New("server: buffer_steps must not be negative")
	}
	return nil
}

func (c KVEventsConfig) encoding() kvevents.Encoding {
	if c.Encoding == "array" {
		return kvevents.EncodingArray
	}
	return kvevents.EncodingMap
}

// Config describes one vllm-sim process.
type Config struct {
	// Model is the model path or name (--model); ServedModelName is what clients ask for
	// (defaults to Model).
	Model           string
	ServedModelName string
	// Engine configures every data-parallel rank's engine.
	Engine sim.Config
	// DataParallelSize engines are served behind one HTTP port; rank r publishes KV events
	// on the endpoint's port + r.
	DataParallelSize int
	// EnablePromptTokensDetails adds usage.prompt_tokens_details.cached_tokens.
	EnablePromptTokensDetails bool
	// TimeScale runs the engines TimeScale times faster than real time (1 = real time).
	// Latency metrics report simulated seconds.
	TimeScale float64
	KVEvents  KVEventsConfig
	// LegacyErrors writes errors flat ({"object":"error",...}) as vLLM did before the
	// OpenAI-compatible {"error":{...}} shape.
	LegacyErrors bool
	// HashSeeded makes every data-parallel rank hash with Engine.HashSeed, as vLLM ranks
	// agree when PYTHONHASHSEED is set; otherwise rank r uses Engine.HashSeed + r, so ranks
	// disagree as unseeded vLLM engine processes do.
	HashSeeded bool
	// GPUMemoryUtilization is only reported in cache_config_info.
	GPUMemoryUtilization float64
}

// DefaultConfig is a Qwen3-0.6B server with 1 GiB of KV cache.
func DefaultConfig() Config {
	return Config{Model: "Qwen/Qwen3-0.6B", Engine: sim.DefaultConfig(), DataParallelSize: 1,
		TimeScale: 1, KVEvents: DefaultKVEventsConfig(), GPUMemoryUtilization: 0.9}
}

// Validate reports the first invalid field.
func (c Config) Validate() error {
	switch {
	case c.Model == "":
		return errors.New("server: --model is required")
	case c.DataParallelSize < 1:
		return errors.New("server: --data-parallel-size must be at least 1")
	case c.TimeScale <= 0:
		return errors.New("server: --time-scale must be positive")
	}
	if err := c.Engine.Validate(); err != nil {
		return err
	}
	return c.KVEvents.Validate()
}

func (c Config) servedName() string {
	if c.ServedModelName != "" {
		return c.ServedModelName
	}
	return c.Model
}
