// Package config reads kvrouter's YAML configuration file. The file is one document
// composed of per-package sections (listen, endpoints, models, policy, limits); each
// section type has a Default...() constructor and a Validate method. Load decodes the
// YAML node tree itself so that every problem (syntax, unknown field, wrong type, broken
// rule) is reported at once with its line and field path, as `kvrouter check-config`
// prints them.
//
// Concurrency: Load and Parse are safe to call concurrently; a *Config is plain data and
// must not be mutated while others read it.
package config
