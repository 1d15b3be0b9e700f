package chattemplate

import "github.com/nikolalohinski/gonja/v2/exec"

// pyNone stands for Python's None in template data. gonja treats a Go nil as
// undefined: `x is defined` is false and {{ x }} prints "", where Jinja2 says a None
// value is defined and prints "None" (e.g. a tool's absent description, which vLLM
// passes as None). The engine sees this value as defined, falsy (its kind is a
// pointer, which gonja's truth test calls false) and printing "None"; the tests none,
// defined and undefined and tojson know it.
type pyNone struct{}

// String is what {{ none_value }} prints.
func (*pyNone) String() string { return "None" }

// noneValue is the one None. It is a pointer to a pointer so that gonja, which looks
// through one level of pointer, sees a non-nil pointer.
var noneValue = func() **pyNone { p := &pyNone{}; return &p }()

// isNone reports whether a template value is None (the sentinel or a Go nil).
func isNone(v *exec.Value) bool {
	if v == nil || v.IsNil() {
		return true
	}
	p, ok := v.Interface().(**pyNone)
	return ok && p == noneValue
}

// withNone copies request data for the template, replacing Go nils with noneValue.
// Containers are copied, never changed in place: some (server default kwargs) are
// shared between concurrent renders.
func withNone(v any) any {
	switch v := v.(type) {
	case nil:
		return noneValue
	case *exec.Dict:
		d := &exec.Dict{Pairs: make([]*exec.Pair, len(v.Pairs))}
		for i, p := range v.Pairs {
			d.Pairs[i] = &exec.Pair{Key: p.Key, Value: exec.AsValue(withNone(p.Value.Interface()))}
		}
		return d
	case []any:
		out := make([]any, len(v))
		for i, e := range v {
			out[i] = withNone(e)
		}
		return out
	}
	return v
}
