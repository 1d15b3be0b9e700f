package config

import (
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/kvrouter/kvrouter/config/field"
)

// Problem is one thing wrong with a configuration file.
type Problem struct {
	// Line is the 1-based line the problem is on (the line of the field, or of its
	// closest enclosing field when the field is missing).
	Line int
	// Path names the field, e.g. "endpoints[1].address"; empty for a syntax error.
	Path string
	// Msg says what is wrong.
	Msg string
}

// Error lists every problem found in one file. Load returns it (use errors.As) when the
// file is unreadable as YAML or breaks any rule.
type Error struct {
	File     string
	Problems []Problem
}

// Error prints the problems one per line as "FILE:LINE: field.path: message".
func (e *Error) Error() string {
	var b strings.Builder
	for i, p := range e.Problems {
		if i > 0 {
			b.WriteByte('\n')
		}
		fmt.Fprintf(&b, "%s:%d: ", e.File, p.Line)
		if p.Path != "" {
			b.WriteString(p.Path + ": ")
		}
		b.WriteString(p.Msg)
	}
	return b.String()
}

// Load reads, decodes and validates the file at path, and checks that the files it
// names exist (relative paths are resolved against the file's directory). Every problem
// is reported, not just the first: the error is an *Error unless the file cannot be read.
func Load(path string) (*Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	base, err := filepath.Abs(filepath.Dir(path))
	if err != nil {
		return nil, fmt.Errorf("config: %w", err)
	}
	return parse(data, path, base)
}

// Parse decodes and validates a configuration document; file names it in errors. It
// touches no file system path (Load does).
func Parse(data []byte, file string) (*Config, error) {
	return parse(data, file, "")
}

var yamlLine = regexp.MustCompile(`^yaml: line (\d+): (.*)$`)

// parse decodes and validates; when base is not empty it also resolves and checks the
// model file paths.
func parse(data []byte, file, base string) (*Config, error) {
	var root yaml.Node
	if err := yaml.Unmarshal(data, &root); err != nil {
		p := Problem{Line: 1, Msg: strings.TrimPrefix(err.Error(), "yaml: ")}
		if m := yamlLine.FindStringSubmatch(err.Error()); m != nil {
			p.Line, _ = strconv.Atoi(m[1])
			p.Msg = m[2]
		}
		return nil, &Error{File: file, Problems: []Problem{p}}
	}
	cfg := Default()
	d := &decoder{lines: map[string]int{}}
	if len(root.Content) == 0 {
		d.addf(1, "", "the file is empty")
		return nil, &Error{File: file, Problems: d.problems}
	}
	d.decode(&root, reflect.ValueOf(&cfg).Elem(), "")

	// A field that failed to decode keeps its default; validating that default would
	// report a second, misleading problem, so rules on such fields are skipped.
	bad := map[string]bool{}
	for _, p := range d.problems {
		bad[p.Path] = true
	}
	var errs field.Errors
	errs.Nest("", cfg.Validate())
	if base != "" {
		errs = append(errs, resolveFiles(&cfg, base)...)
	}
	for _, e := range errs {
		if underBad(e.Path, bad) {
			continue
		}
		d.problems = append(d.problems, Problem{Line: d.lineOf(e.Path), Path: e.Path, Msg: e.Msg})
	}
	if len(d.problems) > 0 {
		slices.SortStableFunc(d.problems, func(a, b Problem) int { return a.Line - b.Line })
		return nil, &Error{File: file, Problems: d.problems}
	}
	return &cfg, nil
}

func underBad(path string, bad map[string]bool) bool {
	for p := path; p != ""; p = parent(p) {
		if bad[p] {
			return true
		}
	}
	return false
}

// resolveFiles makes the model and TLS file paths absolute against base and checks they
// exist (and that the TLS files load).
func resolveFiles(cfg *Config, base string) field.Errors {
	var errs field.Errors
	for _, name := range slices.Sorted(maps.Keys(cfg.Models)) {
		m := cfg.Models[name]
		p := field.Key("models", name)
		for _, f := range []struct {
			path string
			val  *string
			dir  bool
		}{{"tokenizer", &m.Tokenizer, true}, {"tokenizer_json", &m.TokenizerJSON, false}, {"tokenizer_config", &m.TokenizerConfig, false}} {
			if *f.val == "" {
				continue
			}
			if !filepath.IsAbs(*f.val) {
				*f.val = filepath.Join(base, *f.val)
			}
			if msg := checkPath(*f.val, f.dir); msg != "" {
				errs.Addf(field.Join(p, f.path), "%s", msg)
			}
		}
		cfg.Models[name] = m
	}
	// The ext_proc port's certificate files: resolved, then loaded as start-up does (a
	// key of another certificate, a CA bundle without a certificate).
	t := &cfg.Listen.TLS
	missing := false
	for _, f := range []struct {
		path string
		val  *string
	}{{"cert_file", &t.CertFile}, {"key_file", &t.KeyFile}, {"client_ca_file", &t.ClientCAFile}} {
		if *f.val == "" {
			continue
		}
		if !filepath.IsAbs(*f.val) {
			*f.val = filepath.Join(base, *f.val)
		}
		if msg := checkPath(*f.val, false); msg != "" {
			errs.Addf(field.Join("listen.tls", f.path), "%s", msg)
			missing = true
		}
	}
	if !missing && t.Validate() == nil {
		errs.Nest("listen.tls", t.Check())
	}
	return errs
}

func checkPath(p string, dir bool) string {
	st, err := os.Stat(p)
	switch {
	case errors.Is(err, os.ErrNotExist):
		return fmt.Sprintf("%s does not exist", p)
	case err != nil:
		return err.Error()
	case dir && !st.IsDir():
		return fmt.Sprintf("%s is not a directory", p)
	case !dir && st.IsDir():
		return fmt.Sprintf("%s is a directory, want a file", p)
	}
	return ""
}
