// Package fleet is kvrouter's registry of vLLM endpoints: which endpoints exist, which
// models and LoRA adapters each serves, how loaded each is (the router's own in-flight
// count and each endpoint's scraped vLLM /metrics) and which are eligible for requests.
// Endpoints come from the static configuration and may be added, changed or removed at
// run time (Upsert, Remove) by discovery; subscribers hear of every change.
//
// Concurrency: every method of *Fleet is safe for concurrent use. Candidates, Begin and
// End are on the request path: they take no lock shared with scraping and do not block.
// Subscribers are called synchronously, in the goroutine that made the change, and must
// not block or call back into Upsert or Remove.
package fleet
