// Package testmetrics reads one series of a counter or gauge from a Prometheus
// registry in tests, so that tests assert on kvrouter's metrics through the registry
// they were given rather than through package internals.
package testmetrics
