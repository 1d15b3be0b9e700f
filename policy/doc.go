// Package policy is the one list of kvrouter's routing policies: each policy's name, what
// it needs (token ids, the block index), the section of typed configuration it reads and
// its constructor, in a Registry value built once by the caller (Builtin) and passed to
// whoever needs it: config validation, the runner (internal/app) and kvbench. There is no
// global registry and no init() side effect; a caller that needs more policies (kvbench's
// reference partition) builds its own Registry from Builtin's specs plus its own.
//
// Concurrency: a Registry is immutable once built and safe for concurrent use; the
// policies it builds are safe for concurrent use (scoring.Policy's contract).
package policy
