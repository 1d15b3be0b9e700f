package jinja

// Options configure compilation. Chat templates use TrimBlocks and LStripBlocks, as
// transformers configures Jinja2.
type Options struct {
	TrimBlocks   bool
	LStripBlocks bool
	// Globals are extra global values (raise_exception, strftime_now, ...); render
	// variables of the same name take precedence, as in Jinja2.
	Globals map[string]Value
}

// Vars supplies a render's variables by name.
type Vars interface {
	Lookup(name string) (Value, bool)
}

// Template is a compiled template. It is immutable; Render is safe for concurrent use.
type Template struct {
	body     []stmt
	names    []string // top-level slot names
	defaults []Value  // value of each slot when no render variable has the name
}

// Compile parses a template. It returns *SyntaxError for a template Jinja2 would
// reject and *UnsupportedError for one using a construct this engine does not
// implement.
func Compile(src string, opts Options) (*Template, error) {
	items, err := lex(src, opts.TrimBlocks, opts.LStripBlocks)
	if err != nil {
		return nil, err
	}
	top := &fnScope{assigned: map[string]bool{}}
	p := &parser{items: items, fn: top, top: top}
	body, _, err := p.body()
	if err != nil {
		return nil, err
	}
	t := &Template{body: body}
	slots := map[string]int{}
	for _, r := range top.refs {
		i, ok := slots[r.name]
		if !ok {
			i = len(t.names)
			slots[r.name] = i
			t.names = append(t.names, r.name)
			v, ok := opts.Globals[r.name]
			if !ok {
				v, ok = builtinGlobals[r.name]
			}
			if !ok {
				switch r.name {
				case "cycler", "joiner", "lipsum", "caller", "self", "varargs", "kwargs":
					return nil, unsupportedf("global '%s'", r.name)
				}
				v = Undefined(r.name)
			}
			t.defaults = append(t.defaults, v)
		}
		r.slot = i
	}
	var loops int
	t.markMemoLoops(t.body, &loops)
	return t, nil
}

// Names returns the names the template reads or assigns at the top level: the
// render variables it can see.
func (t *Template) Names() []string { return t.names }

// Render renders the template with vars. sizeHint pre-sizes the output.
func (t *Template) Render(vars Vars, sizeHint int) (string, error) {
	st := &state{t: t, top: make([]Value, len(t.names))}
	for i, name := range t.names {
		if v, ok := vars.Lookup(name); ok {
			st.top[i] = v
		} else {
			st.top[i] = t.defaults[i]
		}
	}
	st.out = &output{b: make([]byte, 0, sizeHint)}
	if _, err := execBody(st, t.body); err != nil {
		return "", err
	}
	return st.out.text(), nil
}

// MapVars is Vars over a map.
type MapVars map[string]Value

// Lookup implements Vars.
func (m MapVars) Lookup(name string) (Value, bool) {
	v, ok := m[name]
	return v, ok
}
