// Package kubernetes is kvrouter's Kubernetes discovery source: client-go informers on
// the EndpointSlices of a Service, on the pods matching a label selector, or on an
// InferencePool (inference.networking.k8s.io/v1, through the Inference Extension's
// published Go types) and the pods it selects. After every change it hands the complete
// set of targets to a discovery.Reconciler, which updates the fleet. With an InferencePool
// it also keeps the priorities of the InferenceObjectives that refer to the pool
// (Source.Priority), for the ext_proc server's shedding.
//
// Concurrency: Run owns the informers and the reconciler; it is the only goroutine that
// changes the fleet on the source's behalf. Priority is safe to call from any goroutine.
// New starts nothing.
package kubernetes
