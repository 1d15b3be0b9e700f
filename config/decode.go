package config

import (
	"fmt"
	"math"
	"reflect"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/kvrouter/kvrouter/config/field"
)

// defaulter is implemented by element types (list items, map values) whose zero value is
// not their default: the decoder calls SetDefaults on each new element before decoding
// the YAML onto it, so that an absent field keeps its default and an explicit one is
// validated as written.
type defaulter interface{ SetDefaults() }

var durationType = reflect.TypeFor[time.Duration]()

// decoder decodes YAML nodes onto Go values by their `yaml` tags, recording every problem
// (unknown field, wrong type, duplicate key) with its line instead of stopping at the
// first, and remembering the line each field path was written on.
type decoder struct {
	problems []Problem
	lines    map[string]int
}

func (d *decoder) addf(line int, path, format string, args ...any) {
	d.problems = append(d.problems, Problem{Line: line, Path: path, Msg: fmt.Sprintf(format, args...)})
}

func kindName(n *yaml.Node) string {
	switch n.Kind {
	case yaml.MappingNode:
		return "a mapping"
	case yaml.SequenceNode:
		return "a list"
	case yaml.ScalarNode:
		return fmt.Sprintf("%q", n.Value)
	}
	return "something else"
}

func isNull(n *yaml.Node) bool {
	return n.Kind == yaml.ScalarNode && n.Tag == "!!null"
}

// decode writes n onto v (settable), at path.
func (d *decoder) decode(n *yaml.Node, v reflect.Value, path string) {
	for n.Kind == yaml.AliasNode {
		n = n.Alias
	}
	if n.Kind == yaml.DocumentNode {
		if len(n.Content) == 0 {
			return
		}
		d.decode(n.Content[0], v, path)
		return
	}
	if isNull(n) {
		return // an explicit null keeps the default
	}
	if v.Type() == durationType {
		d.duration(n, v, path)
		return
	}
	switch v.Kind() {
	case reflect.Pointer:
		if v.IsNil() {
			v.Set(newElem(v.Type().Elem()).Addr())
		}
		d.decode(n, v.Elem(), path)
	case reflect.Struct:
		d.structure(n, v, path)
	case reflect.Slice:
		d.list(n, v, path)
	case reflect.Map:
		d.mapping(n, v, path)
	case reflect.String:
		if n.Kind != yaml.ScalarNode {
			d.addf(n.Line, path, "expected a string, got %s", kindName(n))
			return
		}
		v.SetString(n.Value)
	case reflect.Bool:
		var b bool
		if n.Kind != yaml.ScalarNode || n.Tag != "!!bool" || n.Decode(&b) != nil {
			d.addf(n.Line, path, "expected true or false, got %s", kindName(n))
			return
		}
		v.SetBool(b)
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64:
		var i int64
		if n.Kind != yaml.ScalarNode || n.Tag != "!!int" || n.Decode(&i) != nil {
			d.addf(n.Line, path, "expected an integer, got %s", kindName(n))
			return
		}
		if v.OverflowInt(i) {
			d.addf(n.Line, path, "%d is out of range", i)
			return
		}
		v.SetInt(i)
	case reflect.Float32, reflect.Float64:
		var f float64
		if n.Kind != yaml.ScalarNode || (n.Tag != "!!float" && n.Tag != "!!int") || n.Decode(&f) != nil {
			d.addf(n.Line, path, "expected a number, got %s", kindName(n))
			return
		}
		if math.IsNaN(f) || math.IsInf(f, 0) {
			d.addf(n.Line, path, "expected a finite number, got %s", n.Value)
			return
		}
		v.SetFloat(f)
	default:
		// A programming error in the config types, not bad input.
		d.addf(n.Line, path, "field of unsupported Go type %s", v.Type())
	}
}

func (d *decoder) duration(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.ScalarNode || n.Tag != "!!str" {
		d.addf(n.Line, path, "expected a duration such as \"500ms\" or \"2s\", got %s", kindName(n))
		return
	}
	dur, err := time.ParseDuration(n.Value)
	if err != nil {
		d.addf(n.Line, path, "expected a duration such as \"500ms\" or \"2s\", got %q", n.Value)
		return
	}
	v.SetInt(int64(dur))
}

// fieldsOf maps the YAML names of a struct's fields (inline structs flattened) to the
// index paths of the fields.
func fieldsOf(t reflect.Type) map[string][]int {
	out := map[string][]int{}
	for i := range t.NumField() {
		f := t.Field(i)
		if !f.IsExported() {
			continue
		}
		tag := f.Tag.Get("yaml")
		name, opts, _ := strings.Cut(tag, ",")
		if name == "-" {
			continue
		}
		if opts == "inline" && f.Type.Kind() == reflect.Struct {
			for k, idx := range fieldsOf(f.Type) {
				out[k] = append([]int{i}, idx...)
			}
			continue
		}
		if name == "" {
			name = strings.ToLower(f.Name)
		}
		out[name] = []int{i}
	}
	return out
}

func (d *decoder) structure(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.MappingNode {
		d.addf(n.Line, path, "expected a mapping, got %s", kindName(n))
		return
	}
	fields := fieldsOf(v.Type())
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		p := field.Join(path, k.Value)
		if first, dup := seen[k.Value]; dup {
			d.addf(k.Line, p, "set twice (first on line %d)", first)
			continue
		}
		seen[k.Value] = k.Line
		idx, ok := fields[k.Value]
		if !ok {
			d.addf(k.Line, p, "unknown field%s", suggest(k.Value, fields))
			continue
		}
		d.lines[p] = k.Line
		d.decode(val, v.FieldByIndex(idx), p)
	}
}

func suggest(name string, fields map[string][]int) string {
	names := make([]string, 0, len(fields))
	for k := range fields {
		names = append(names, k)
	}
	best, bestD := "", 3
	for _, k := range names {
		if dist := editDistance(name, k); dist < bestD || (dist == bestD && k < best) {
			best, bestD = k, dist
		}
	}
	if best == "" {
		return ""
	}
	return fmt.Sprintf(" (did you mean %q?)", best)
}

func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

func newElem(t reflect.Type) reflect.Value {
	e := reflect.New(t)
	if df, ok := e.Interface().(defaulter); ok {
		df.SetDefaults()
	}
	return e.Elem()
}

func (d *decoder) list(n *yaml.Node, v reflect.Value, path string) {
	if n.Kind != yaml.SequenceNode {
		d.addf(n.Line, path, "expected a list, got %s", kindName(n))
		return
	}
	out := reflect.MakeSlice(v.Type(), 0, len(n.Content))
	for i, item := range n.Content {
		p := field.Index(path, i)
		d.lines[p] = item.Line
		e := newElem(v.Type().Elem())
		d.decode(item, e, p)
		out = reflect.Append(out, e)
	}
	v.Set(out)
}

func (d *decoder) mapping(n *yaml.Node, v reflect.Value, path string) {
	if v.Type().Key().Kind() != reflect.String {
		d.addf(n.Line, path, "field of unsupported Go type %s", v.Type())
		return
	}
	if n.Kind != yaml.MappingNode {
		d.addf(n.Line, path, "expected a mapping, got %s", kindName(n))
		return
	}
	out := reflect.MakeMapWithSize(v.Type(), len(n.Content)/2)
	seen := map[string]int{}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, val := n.Content[i], n.Content[i+1]
		p := field.Key(path, k.Value)
		if k.Kind != yaml.ScalarNode || k.Value == "" {
			d.addf(k.Line, path, "map keys must be non-empty strings")
			continue
		}
		if first, dup := seen[k.Value]; dup {
			d.addf(k.Line, p, "set twice (first on line %d)", first)
			continue
		}
		seen[k.Value] = k.Line
		d.lines[p] = k.Line
		e := newElem(v.Type().Elem())
		d.decode(val, e, p)
		out.SetMapIndex(reflect.ValueOf(k.Value).Convert(v.Type().Key()), e)
	}
	v.Set(out)
}

// lineOf finds the line a path was written on, or the line of its closest written
// ancestor (a missing field is reported where its parent is), or 1.
func (d *decoder) lineOf(path string) int {
	for p := path; p != ""; p = parent(p) {
		if l, ok := d.lines[p]; ok {
			return l
		}
	}
	return 1
}

// parent strips the last element of a path: `a.b[2]` -> `a.b`, `a["x.y"]` -> `a`.
func parent(p string) string {
	if strings.HasSuffix(p, "]") {
		if i := strings.LastIndex(p, "["); i >= 0 {
			// A quoted key may contain "[": find the bracket that opens the quoted string.
			if j := strings.LastIndex(p, `["`); j >= 0 && strings.HasSuffix(p, `"]`) {
				if _, err := strconv.Unquote(p[j+1 : len(p)-1]); err == nil {
					return p[:j]
				}
			}
			return p[:i]
		}
	}
	if i := strings.LastIndexAny(p, ".["); i >= 0 {
		return p[:i]
	}
	return ""
}
