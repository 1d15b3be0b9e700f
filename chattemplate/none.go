package chattemplate

import (
	"math/big"

	"github.com/nikolalohinski/gonja/v2/exec"

	"github.com/kvrouter/kvrouter/chattemplate/internal/jinja"
)

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

// toGonja converts a template value for the gonja engine: None (and undefined) to
// noneValue, dicts to ordered *exec.Dict, lists to []any, numbers to int, *big.Int or
// float64. Values are copied, never shared with gonja, which may hold on to them.
func toGonja(v jinja.Value) any {
	switch v.Kind() {
	case jinja.KindBool:
		return v.BoolValue()
	case jinja.KindInt:
		return int(v.IntValue())
	case jinja.KindBigInt:
		return new(big.Int).Set(v.Big())
	case jinja.KindFloat:
		return v.FloatValue()
	case jinja.KindString:
		return v.Str()
	case jinja.KindList:
		items := v.List().Items
		out := make([]any, len(items))
		for i, e := range items {
			out[i] = toGonja(e)
		}
		return out
	case jinja.KindDict:
		pairs := v.Dict().Pairs()
		d := &exec.Dict{Pairs: make([]*exec.Pair, len(pairs))}
		for i, p := range pairs {
			d.Pairs[i] = &exec.Pair{Key: exec.AsValue(toGonja(p.Key)), Value: exec.AsValue(toGonja(p.Value))}
		}
		return d
	}
	return noneValue
}
