package chattemplate

import (
	"errors"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/nikolalohinski/gonja/v2/builtins"
	"github.com/nikolalohinski/gonja/v2/config"
	"github.com/nikolalohinski/gonja/v2/exec"
	"github.com/nikolalohinski/gonja/v2/loaders"
	"github.com/nikolalohinski/gonja/v2/nodes"
	"github.com/nikolalohinski/gonja/v2/parser"
	"github.com/nikolalohinski/gonja/v2/tokens"
)

// engineConfig is the Jinja configuration transformers uses for chat templates.
func engineConfig() *config.Config {
	c := config.New()
	c.TrimBlocks = true
	c.LeftStripBlocks = true
	c.AutoEscape = false
	c.StrictUndefined = false
	return c
}

// newEnvironment builds the engine environment for one compiled template: gonja's
// builtins with the parts transformers and Jinja2's immutable sandbox define differently
// replaced (tojson, the true/false tests, order-preserving and non-mutating dict and
// list methods) and the two globals transformers adds.
func newEnvironment(now func() time.Time) (*exec.Environment, error) {
	filters := exec.NewFilterSet(map[string]exec.FilterFunction{}).Update(builtins.Filters)
	for name, fn := range map[string]exec.FilterFunction{"tojson": filterToJSON, "dictsort": filterDictsort, "items": filterItems} {
		var err error
		if filters.Exists(name) {
			err = filters.Replace(name, fn)
		} else {
			err = filters.Register(name, fn)
		}
		if err != nil {
			return nil, err
		}
	}

	tests := exec.NewTestSet(map[string]exec.TestFunction{}).Update(builtins.Tests)
	for name, fn := range map[string]exec.TestFunction{
		// Jinja2: `x is true` / `x is false` are identity tests on the booleans;
		// gonja's versions treat None as false.
		"true": func(_ *exec.Context, in *exec.Value, _ *exec.VarArgs) (bool, error) {
			return in.IsBool() && in.Bool(), nil
		},
		"false": func(_ *exec.Context, in *exec.Value, _ *exec.VarArgs) (bool, error) {
			return in.IsBool() && !in.Bool(), nil
		},
		// None is a value (see pyNone); gonja's none test only knows Go nil.
		"none": func(_ *exec.Context, in *exec.Value, _ *exec.VarArgs) (bool, error) {
			return isNone(in), nil
		},
		// Jinja2's number test is isinstance(x, Number): booleans are numbers.
		"number": func(_ *exec.Context, in *exec.Value, _ *exec.VarArgs) (bool, error) {
			return in.IsNumber() || in.IsBool(), nil
		},
	} {
		if err := tests.Replace(name, fn); err != nil {
			return nil, err
		}
	}

	globals := exec.EmptyContext().Update(builtins.GlobalFunctions).Update(builtins.GlobalVariables)
	globals.Set("strftime_now", func(va *exec.VarArgs) (any, error) {
		if len(va.Args) != 1 || !va.Args[0].IsString() {
			return nil, errors.New("strftime_now takes one string argument")
		}
		return strftime(now(), va.Args[0].String()), nil
	})

	controls := exec.NewControlStructureSet(map[string]parser.ControlStructureParser{}).Update(builtins.ControlStructures)
	if err := controls.Register("generation", generationParser); err != nil {
		return nil, err
	}

	return &exec.Environment{
		Context:           globals,
		Filters:           filters,
		Tests:             tests,
		ControlStructures: controls,
		Methods: exec.Methods{
			Bool:  builtins.Methods.Bool,
			Int:   builtins.Methods.Int,
			Float: builtins.Methods.Float,
			Str:   newStrMethods(),
			Dict:  dictMethods,
			List:  listMethods,
		},
	}, nil
}

// filterToJSON is transformers' tojson: json.dumps(x, ensure_ascii=False, indent=None,
// separators=None, sort_keys=False) with those four keyword arguments exposed.
func filterToJSON(_ *exec.Evaluator, in *exec.Value, params *exec.VarArgs) *exec.Value {
	if in.IsError() {
		return in
	}
	o := defaultDumpOptions()
	args := map[string]*exec.Value{}
	names := []string{"ensure_ascii", "indent", "separators", "sort_keys"}
	if len(params.Args) > len(names) {
		return exec.AsValue(errors.New("tojson: too many arguments"))
	}
	for i, a := range params.Args {
		args[names[i]] = a
	}
	for k, v := range params.KwArgs {
		if _, dup := args[k]; dup {
			return exec.AsValue(fmt.Errorf("tojson: argument %s given twice", k))
		}
		args[k] = v
	}
	for k, v := range args {
		switch k {
		case "ensure_ascii":
			o.ensureASCII = v.IsTrue()
		case "sort_keys":
			o.sortKeys = v.IsTrue()
		case "indent":
			switch {
			case v.IsNil():
			case v.IsString():
				s := v.String()
				o.indent = &s
			case v.IsInteger() && !v.IsBool():
				s := strings.Repeat(" ", max(0, v.Integer()))
				o.indent = &s
			default:
				return exec.AsValue(fmt.Errorf("tojson: indent must be an int or a string"))
			}
		case "separators":
			if v.IsNil() {
				continue
			}
			if !v.IsList() || v.Len() != 2 || !v.Index(0).IsString() || !v.Index(1).IsString() {
				return exec.AsValue(errors.New("tojson: separators must be a pair of strings"))
			}
			o.itemSep, o.keySep = v.Index(0).String(), v.Index(1).String()
			continue
		default:
			return exec.AsValue(fmt.Errorf("tojson: unexpected argument %s", k))
		}
	}
	if _, ok := args["separators"]; !ok || args["separators"].IsNil() {
		if o.indent != nil {
			o.itemSep = "," // json.dumps drops the trailing space when indenting
		}
	}
	s, err := pyDumps(in, o)
	if err != nil {
		return exec.AsValue(err)
	}
	return exec.AsSafeValue(s)
}

// dictMethods are the non-mutating dict methods, iterating in insertion order as a
// Python dict does. Mutating methods are absent: the immutable sandbox forbids them.
var dictMethods = exec.NewMethodSet[map[string]any](map[string]exec.Method[map[string]any]{
	"items": func(_ map[string]any, self *exec.Value, args *exec.VarArgs) (any, error) {
		if len(args.Args)+len(args.KwArgs) != 0 {
			return nil, errors.New("items() takes no arguments")
		}
		out := []any{}
		self.Iterate(func(_, _ int, k, v *exec.Value) bool {
			out = append(out, []any{k, v})
			return true
		}, func() {})
		return out, nil
	},
	"keys": func(_ map[string]any, self *exec.Value, args *exec.VarArgs) (any, error) {
		if len(args.Args)+len(args.KwArgs) != 0 {
			return nil, errors.New("keys() takes no arguments")
		}
		out := []any{}
		self.Iterate(func(_, _ int, k, _ *exec.Value) bool {
			out = append(out, k)
			return true
		}, func() {})
		return out, nil
	},
	"values": func(_ map[string]any, self *exec.Value, args *exec.VarArgs) (any, error) {
		if len(args.Args)+len(args.KwArgs) != 0 {
			return nil, errors.New("values() takes no arguments")
		}
		out := []any{}
		self.Iterate(func(_, _ int, _, v *exec.Value) bool {
			out = append(out, v)
			return true
		}, func() {})
		return out, nil
	},
	"get": func(_ map[string]any, self *exec.Value, args *exec.VarArgs) (any, error) {
		if len(args.Args) < 1 || len(args.Args) > 2 || len(args.KwArgs) != 0 {
			return nil, errors.New("get() takes 1 or 2 positional arguments")
		}
		var found *exec.Value
		self.Iterate(func(_, _ int, k, v *exec.Value) bool {
			if k.EqualValueTo(args.Args[0]) {
				found = v
				return false
			}
			return true
		}, func() {})
		if found != nil {
			return found.Interface(), nil
		}
		if len(args.Args) == 2 {
			return args.Args[1].Interface(), nil
		}
		return noneValue, nil
	},
})

// listMethods are the non-mutating list methods.
var listMethods = exec.NewMethodSet[[]any](map[string]exec.Method[[]any]{
	"index": func(self []any, _ *exec.Value, args *exec.VarArgs) (any, error) {
		if len(args.Args) != 1 {
			return nil, errors.New("index() takes one argument")
		}
		for i, v := range self {
			if exec.ToValue(v).EqualValueTo(args.Args[0]) {
				return i, nil
			}
		}
		return nil, fmt.Errorf("%s is not in list", args.Args[0].String())
	},
	"count": func(self []any, _ *exec.Value, args *exec.VarArgs) (any, error) {
		if len(args.Args) != 1 {
			return nil, errors.New("count() takes one argument")
		}
		n := 0
		for _, v := range self {
			if exec.ToValue(v).EqualValueTo(args.Args[0]) {
				n++
			}
		}
		return n, nil
	},
})

// rootLoader serves the one template source and refuses includes: a chat template is
// self-contained, and it must not read files.
type rootLoader struct {
	id, src string
}

func (l rootLoader) Read(path string) (io.Reader, error) {
	if path != l.id {
		return nil, fmt.Errorf("template %q: includes are not supported", path)
	}
	return strings.NewReader(l.src), nil
}

func (l rootLoader) Resolve(path string) (string, error) { return path, nil }

func (l rootLoader) Inherit(string) (loaders.Loader, error) {
	return nil, errors.New("includes are not supported")
}

// generationBlock is transformers' {% generation %} ... {% endgeneration %} tag
// (AssistantTracker): the body renders as is, in its own scope, as Jinja2 renders a
// call block.
type generationBlock struct {
	position *tokens.Token
	body     *nodes.Wrapper
}

func (g *generationBlock) Position() *tokens.Token { return g.position }

func (g *generationBlock) String() string {
	return fmt.Sprintf("GenerationControlStructure(Line=%d Col=%d)", g.position.Line, g.position.Col)
}

func (g *generationBlock) Execute(r *exec.Renderer, _ *nodes.ControlStructureBlock) error {
	return r.Inherit().ExecuteWrapper(g.body)
}

func generationParser(p *parser.Parser, args *parser.Parser) (nodes.ControlStructure, error) {
	g := &generationBlock{position: p.Current()}
	if !args.End() {
		return nil, args.Error("generation takes no arguments", nil)
	}
	body, _, err := p.WrapUntil("endgeneration")
	if err != nil {
		return nil, err
	}
	g.body = body
	return g, nil
}
