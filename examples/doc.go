// Package examples holds no code: its tests check that every manifest under examples/
// and every rendering of charts/kvrouter parses strictly into the Kubernetes, Gateway
// API, Inference Extension and Istio Go types, and that the kvrouter and Envoy
// configurations they carry pass kvrouter's own checks. TestEveryPackageHasAREADME
// checks the repository's other documentation contract: every Go package has a
// README.md in the house sections (What it does, Configuration, Metrics, Examples).
package examples
