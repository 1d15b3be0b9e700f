// Package envoy holds the Envoy configurations that put kvrouter in front of a vLLM pool
// (envoy.yaml, envoy-buffered.yaml, envoy-failopen.yaml) and the code that checks them:
// Load parses an Envoy bootstrap YAML into go-control-plane's proto with every typed
// config resolved and runs the generated validators; Check enforces the rules Envoy
// applies in code at config load, and those kvrouter's routing depends on, that the
// validators miss.
//
// Concurrency: Load and Check are pure functions, safe for concurrent use.
package envoy
