package jinja

import (
	"errors"
	"fmt"
)

// SyntaxError is a template Jinja2 would not compile either.
type SyntaxError struct {
	Line int
	Msg  string
}

// Error implements error.
func (e *SyntaxError) Error() string { return fmt.Sprintf("jinja: line %d: %s", e.Line, e.Msg) }

// UnsupportedError reports a construct this engine does not implement (a tag,
// filter, test, method or operand type). At compile time it refuses the template; at
// render time it means the one render cannot be reproduced here. chattemplate routes
// such requests by load; it never stands for a difference from Jinja2.
type UnsupportedError struct {
	Construct string
}

// Error implements error.
func (e *UnsupportedError) Error() string { return "jinja: unsupported: " + e.Construct }

// ErrUndefined is wrapped by errors from using an undefined value where Jinja2's
// default Undefined raises (attribute access, arithmetic, calls).
var ErrUndefined = errors.New("undefined value")

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }

func errorf(format string, args ...any) error {
	return fmt.Errorf("jinja: "+format, args...)
}

func unsupportedf(format string, args ...any) error {
	return &UnsupportedError{Construct: fmt.Sprintf(format, args...)}
}

func undefinedError(v Value) error {
	if v.s != "" {
		return fmt.Errorf("jinja: %w: '%s' is undefined", ErrUndefined, v.s)
	}
	return fmt.Errorf("jinja: %w", ErrUndefined)
}
