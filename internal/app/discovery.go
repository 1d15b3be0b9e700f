package app

import (
	"context"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
	"go.uber.org/zap"

	"github.com/kvrouter/kvrouter/discovery"
	kdisc "github.com/kvrouter/kvrouter/discovery/kubernetes"
	"github.com/kvrouter/kvrouter/fleet"
)

// runner is a discovery source.
type runner interface {
	Run(ctx context.Context) error
}

// newDiscovery builds the configured discovery source feeding f, or nil when the
// configuration has none. It starts nothing.
func newDiscovery(d discovery.Config, f *fleet.Fleet, o Options, log *zap.Logger, reg prometheus.Registerer) (runner, error) {
	if !d.Enabled() {
		return nil, nil
	}
	opts := discovery.Options{Logger: log.Named("discovery"), Metrics: discovery.NewMetrics(reg), Clock: o.Clock}
	switch {
	case d.Kubernetes != nil:
		var clients kdisc.Clients
		if o.KubeClients != nil {
			clients = *o.KubeClients
		} else {
			var err error
			if clients, err = kdisc.NewClients(d.Kubernetes); err != nil {
				return nil, fmt.Errorf("app: %w", err)
			}
		}
		s, err := kdisc.New(*d.Kubernetes, d.KVEvents, clients, f, opts)
		if err != nil {
			return nil, fmt.Errorf("app: %w", err)
		}
		return s, nil
	default:
		s, err := discovery.NewDNS(*d.DNS, d.KVEvents, f, o.Resolver, opts)
		if err != nil {
			return nil, fmt.Errorf("app: %w", err)
		}
		return s, nil
	}
}
