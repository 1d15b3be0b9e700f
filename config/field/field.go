// Package field collects configuration problems, each tied to the path of the field it
// concerns ("endpoints[2].address"). Packages that own a section of kvrouter's
// configuration return these from their Validate methods; package config maps each path
// back to the line of the YAML file it came from.
//
// Concurrency: values are plain data; an Errors list must not be appended to from several
// goroutines at once.
package field

import (
	"fmt"
	"regexp"
	"strings"
)

// Error is one problem with one field.
type Error struct {
	// Path names the field: dotted struct fields, "[i]" for list items and
	// `["key"]` for map entries, e.g. `models["Qwen/Qwen3-0.6B"].block_size`.
	// Empty for a problem with the whole document.
	Path string
	// Msg says what is wrong, in lower case, without the path.
	Msg string
}

// Error returns "path: message", or the message alone for a document-wide problem.
func (e *Error) Error() string {
	if e.Path == "" {
		return e.Msg
	}
	return e.Path + ": " + e.Msg
}

// Errors is a list of problems; it is an error when not empty. The zero value is ready
// to use.
type Errors []*Error

// Error joins the problems, one per line.
func (l Errors) Error() string {
	var b strings.Builder
	for i, e := range l {
		if i > 0 {
			b.WriteByte('\n')
		}
		b.WriteString(e.Error())
	}
	return b.String()
}

// Addf records a problem with the field at path.
func (l *Errors) Addf(path, format string, args ...any) {
	*l = append(*l, &Error{Path: path, Msg: fmt.Sprintf(format, args...)})
}

// Nest records the problems of err, a nested section's Validate result, under prefix.
// A plain error (not Errors or *Error) is recorded as a problem with prefix itself.
func (l *Errors) Nest(prefix string, err error) {
	switch e := err.(type) {
	case nil:
	case Errors:
		for _, p := range e {
			*l = append(*l, &Error{Path: Join(prefix, p.Path), Msg: p.Msg})
		}
	case *Error:
		*l = append(*l, &Error{Path: Join(prefix, e.Path), Msg: e.Msg})
	default:
		*l = append(*l, &Error{Path: prefix, Msg: err.Error()})
	}
}

// Err returns l as an error, or nil when it holds no problem.
func (l Errors) Err() error {
	if len(l) == 0 {
		return nil
	}
	return l
}

// Join appends a relative path to a prefix: Join("endpoints[0]", "address") is
// "endpoints[0].address"; Join("endpoints", "[0]") is "endpoints[0]".
func Join(prefix, rel string) string {
	switch {
	case prefix == "":
		return rel
	case rel == "":
		return prefix
	case rel[0] == '[':
		return prefix + rel
	default:
		return prefix + "." + rel
	}
}

// Index is the path of item i of the list at path.
func Index(path string, i int) string { return fmt.Sprintf("%s[%d]", path, i) }

var plainKey = regexp.MustCompile(`^[A-Za-z_][A-Za-z0-9_]*$`)

// Key is the path of entry key of the map at path. Keys that are plain identifiers are
// written with a dot (`weights.load`), any other key quoted in brackets
// (`models["Qwen/Qwen3-0.6B"]`), so that paths stay unambiguous.
func Key(path, key string) string {
	if plainKey.MatchString(key) {
		return Join(path, key)
	}
	return fmt.Sprintf("%s[%q]", path, key)
}
