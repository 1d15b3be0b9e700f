// Package jinja is a Jinja2 engine for chat templates: the subset of Jinja2 that model
// chat templates use, rendered exactly as Python's Jinja2 3.1 renders it in the
// environment transformers builds for apply_chat_template (ImmutableSandboxedEnvironment,
// trim_blocks and lstrip_blocks as options, loop controls, transformers' tojson).
//
// Compile lexes and parses a template once into an AST whose variables are resolved
// to frame slots; Render evaluates it over a small value model (Value: Undefined,
// None, bool, int, big int, float, str, list/tuple, insertion-ordered dict, namespace,
// loop, macro, function). Python semantics are kept where templates can observe them:
// truthiness, int/float arithmetic and repr, str() of lists and tuples, string indexing
// and slicing by character, a fresh scope per loop iteration, Jinja2's default
// Undefined (prints "", iterates as empty, raises on attribute access and arithmetic),
// attribute-then-item lookup and the sandbox's refusal of mutating methods.
//
// Anything outside the implemented subset is refused, never approximated: Compile
// returns *UnsupportedError for an unknown tag, filter or test (and *SyntaxError for
// a template Jinja2 would reject), and Render returns an error wrapping
// *UnsupportedError for an operation it does not implement on the operands it got
// (a %-format verb, a str.format spec, a case mapping Go does not share with Python).
// chattemplate routes such requests by load.
//
// Concurrency: a *Template is immutable after Compile and Render is safe for
// concurrent use; values passed to Render must not be changed while it runs (the
// engine never changes them: only namespaces created by the template are mutable).
// Nothing in the package logs or starts goroutines.
package jinja
