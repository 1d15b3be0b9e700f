// Package rewrite is the Gateway API Inference Extension's InferenceModelRewrite
// (inference.networking.x-k8s.io/v1alpha2) as kvrouter applies it: rules that map the
// model a request names to one of weighted target models, for model aliasing, a generic
// fallback (a rule with no match) and traffic splitting between models one pool serves.
//
// A Rewrite has the shape of the resource's spec; Validate refuses a rule the router
// could not apply, so that a request never fails because of a rewrite. A Table orders
// the rules of several Rewrites by the resource's precedence and answers Lookup; Choose
// makes the weighted choice with the caller's random source.
//
// Concurrency: a Table is immutable once built and safe for concurrent use; Choose is
// as safe as the functions it is given.
package rewrite
