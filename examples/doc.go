// Package examples holds no code: its tests check that every manifest under examples/
// and every rendering of charts/kvrouter parses strictly into the Kubernetes, Gateway
// API, Inference Extension and Istio Go types, and that the kvrouter and Envoy
// configurations they carry pass kvrouter's own checks.
package examples
