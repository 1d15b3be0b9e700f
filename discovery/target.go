package discovery

import (
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"

	"github.com/kvrouter/kvrouter/fleet"
)

// Target is one vLLM HTTP server a source found: a pod, or one port of a pod whose
// data-parallel ranks serve HTTP on separate ports.
type Target struct {
	// ID identifies the target across updates ("namespace/pod", "namespace/pod:port",
	// or the IP for dns). A target whose ID stays but whose address changes is a new
	// endpoint: the old one is removed at once.
	ID string
	// IP and Port are the HTTP address.
	IP   netip.Addr
	Port uint16
	// Ready says the target may receive requests.
	Ready bool
	// Annotations are the pod's annotations (nil when the source has none): see
	// AnnotationModels and its siblings.
	Annotations map[string]string
	// Rank, when >= 0, says the target is data-parallel rank Rank of its pod, serving HTTP
	// on its own port: it publishes KV events on kv_events.port + Rank only. -1: the
	// target is the whole pod, publishing on kv_events.port + r for each of its ranks.
	Rank int
}

// EndpointFor builds the fleet endpoint of a target: its HTTP address, models (the
// pod's annotations, else tc's), metrics URL and KV events endpoints. The error names
// the annotation at fault.
func EndpointFor(tc *TargetConfig, ev *KVEventsConfig, t Target) (fleet.EndpointConfig, error) {
	if !t.IP.IsValid() || t.Port == 0 {
		return fleet.EndpointConfig{}, fmt.Errorf("discovery: target %s has no address", t.ID)
	}
	addr := netip.AddrPortFrom(t.IP.Unmap(), t.Port)
	ep := fleet.EndpointConfig{
		Address:      addr.String(),
		Models:       slices.Clone(tc.Models),
		LoRAAdapters: slices.Clone(tc.LoRAAdapters),
	}
	dp := ev.DataParallelSize
	if v, ok := t.Annotations[AnnotationModels]; ok {
		ep.Models = nil
		for _, m := range strings.Split(v, ",") {
			if m = strings.TrimSpace(m); m != "" {
				ep.Models = append(ep.Models, m)
			}
		}
		if len(ep.Models) == 0 {
			return fleet.EndpointConfig{}, fmt.Errorf("discovery: target %s: annotation %s is empty", t.ID, AnnotationModels)
		}
	}
	if v, ok := t.Annotations[AnnotationLoRAAdapters]; ok {
		ep.LoRAAdapters = nil
		for _, pair := range strings.Split(v, ",") {
			if pair = strings.TrimSpace(pair); pair == "" {
				continue
			}
			name, base, ok := strings.Cut(pair, "=")
			if !ok || strings.TrimSpace(name) == "" || strings.TrimSpace(base) == "" {
				return fleet.EndpointConfig{}, fmt.Errorf("discovery: target %s: annotation %s: %q is not name=base_model", t.ID, AnnotationLoRAAdapters, pair)
			}
			ep.LoRAAdapters = append(ep.LoRAAdapters, fleet.LoRAAdapter{Name: strings.TrimSpace(name), BaseModel: strings.TrimSpace(base)})
		}
	}
	if v, ok := t.Annotations[AnnotationDataParallelSize]; ok {
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 1 || n > MaxDataParallelSize {
			return fleet.EndpointConfig{}, fmt.Errorf("discovery: target %s: annotation %s: %q is not in [1, %d]", t.ID, AnnotationDataParallelSize, v, MaxDataParallelSize)
		}
		dp = n
	}
	if len(ep.Models) == 0 {
		return fleet.EndpointConfig{}, fmt.Errorf("discovery: target %s: no models: set models in the configuration or annotate the pod with %s", t.ID, AnnotationModels)
	}
	if tc.MetricsPath != "-" {
		ep.MetricsURL = "http://" + addr.String() + tc.MetricsPath
	}
	if ev.Mode == ModeCentral {
		// The pod's publishers connect to kvrouter; its replay ROUTER is still bound on
		// the pod (vLLM always binds it).
		first, n := 0, dp
		if t.Rank >= 0 {
			first, n = t.Rank, 1
		}
		for r := first; r < first+n; r++ {
			ep.KVEvents.CentralRanks = append(ep.KVEvents.CentralRanks, r)
			if ev.ReplayPort != 0 {
				if ev.ReplayPort+r > 65535 {
					return fleet.EndpointConfig{}, fmt.Errorf("discovery: target %s: replay port %d+%d is over 65535", t.ID, ev.ReplayPort, r)
				}
				ep.KVEvents.ReplayEndpoints = append(ep.KVEvents.ReplayEndpoints, zmqTCP(t.IP, ev.ReplayPort+r))
			}
		}
	}
	if ev.Mode == ModePerPod && ev.Port != 0 {
		first, n := 0, dp
		if t.Rank >= 0 {
			first, n = t.Rank, 1
		}
		ep.KVEvents.Topic = ev.Topic
		for r := first; r < first+n; r++ {
			port := ev.Port + r
			if port > 65535 {
				return fleet.EndpointConfig{}, fmt.Errorf("discovery: target %s: events port %d+%d is over 65535", t.ID, ev.Port, r)
			}
			ep.KVEvents.Endpoints = append(ep.KVEvents.Endpoints, zmqTCP(t.IP, port))
			if ev.ReplayPort != 0 {
				if ev.ReplayPort+r > 65535 {
					return fleet.EndpointConfig{}, fmt.Errorf("discovery: target %s: replay port %d+%d is over 65535", t.ID, ev.ReplayPort, r)
				}
				ep.KVEvents.ReplayEndpoints = append(ep.KVEvents.ReplayEndpoints, zmqTCP(t.IP, ev.ReplayPort+r))
			}
		}
	}
	if err := ep.Validate(); err != nil {
		return fleet.EndpointConfig{}, fmt.Errorf("discovery: target %s: %w", t.ID, err)
	}
	return ep, nil
}

func zmqTCP(ip netip.Addr, port int) string {
	return "tcp://" + netip.AddrPortFrom(ip.Unmap(), uint16(port)).String()
}
