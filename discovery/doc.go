// Package discovery keeps kvrouter's fleet in step with the vLLM pods that exist: it
// holds the discovery section of the configuration, the Reconciler that turns a source's
// complete view of its targets into fleet.Upsert, SetReady and Remove calls (with the
// unready grace period), and the DNS source. The Kubernetes source lives in
// discovery/kubernetes, so that this package and the configuration stay free of
// client-go.
//
// Discovery only changes the fleet. The KV-event subscriber and the index follow the
// fleet's change notifications: Added means subscribe, Removed means unsubscribe and
// purge; StateChanged with Ready false means the endpoint receives no requests but its
// KV state is kept.
//
// Concurrency: a Reconciler is driven by one goroutine (its source's Run); sources are
// safe to run concurrently with the fleet's readers. Constructors start nothing; Run
// does, and returns when its context ends.
package discovery
