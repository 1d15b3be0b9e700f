package examples_test

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// dockerBuild is the go build command of the Dockerfile's build stage.
type dockerBuild struct {
	flags []string // between "go build" and "-o"
	pkgs  []string // after "-o DIR"
	cgo0  bool     // ENV CGO_ENABLED=0 in the build stage
	final map[string]dockerStage
}

type dockerStage struct{ from, user string }

// shellWords splits a command line as sh would for plain words and double quotes.
func shellWords(s string) []string {
	var out []string
	var cur strings.Builder
	inWord, quoted := false, false
	for _, r := range s {
		switch {
		case r == '"':
			quoted = !quoted
			inWord = true
		case (r == ' ' || r == '\t') && !quoted:
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteRune(r)
			inWord = true
		}
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out
}

var fromLine = regexp.MustCompile(`(?i)^FROM\s+(?:--platform=\S+\s+)?(\S+)(?:\s+AS\s+(\S+))?$`)

func parseDockerfile(t *testing.T, path string) dockerBuild {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	text := strings.ReplaceAll(string(data), "\\\n", " ")
	b := dockerBuild{final: map[string]dockerStage{}}
	stage := ""
	for _, line := range strings.Split(text, "\n") {
		line = strings.TrimSpace(line)
		if m := fromLine.FindStringSubmatch(line); m != nil {
			stage = m[2]
			b.final[stage] = dockerStage{from: m[1]}
			continue
		}
		switch {
		case strings.HasPrefix(line, "USER "):
			s := b.final[stage]
			s.user = strings.TrimSpace(strings.TrimPrefix(line, "USER "))
			b.final[stage] = s
		case stage == "build" && line == "ENV CGO_ENABLED=0":
			b.cgo0 = true
		case stage == "build" && strings.Contains(line, "go build"):
			words := shellWords(line[strings.Index(line, "go build")+len("go build"):])
			for i, w := range words {
				if w == "-o" && i+1 < len(words) {
					b.pkgs = words[i+2:]
					break
				}
				b.flags = append(b.flags, w)
			}
		}
	}
	return b
}

// ldflagsX matches a linker -X assignment: package path, variable, value.
var ldflagsX = regexp.MustCompile(`-X (\S+)\.(\w+)=(\S*)`)

// The Dockerfile's -X assignments name string variables the package declares (the
// linker ignores a name it does not find, so a rename would silently drop the version).
func TestDockerfileLinkerVariables(t *testing.T) {
	b := parseDockerfile(t, "../Dockerfile")
	found := 0
	for _, f := range b.flags {
		for _, m := range ldflagsX.FindAllStringSubmatch(f, -1) {
			found++
			dir, ok := strings.CutPrefix(m[1], "github.com/kvrouter/kvrouter/")
			if !ok {
				t.Errorf("-X %s.%s: not one of kvrouter's packages", m[1], m[2])
				continue
			}
			if !declaresString(t, filepath.Join("..", dir), m[2]) {
				t.Errorf("-X %s.%s: %s declares no package-level string variable %s", m[1], m[2], dir, m[2])
			}
		}
	}
	if found == 0 {
		t.Error("the Dockerfile's go build sets no version with -X")
	}
}

// declaresString tells whether the Go package in dir (its non-test files) declares a
// package-level variable name of type string.
func declaresString(t *testing.T, dir, name string) bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, file := range files {
		if strings.HasSuffix(file, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(token.NewFileSet(), file, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		for _, d := range f.Decls {
			gd, ok := d.(*ast.GenDecl)
			if !ok || gd.Tok != token.VAR {
				continue
			}
			for _, spec := range gd.Specs {
				vs := spec.(*ast.ValueSpec)
				if id, ok := vs.Type.(*ast.Ident); !ok || id.Name != "string" {
					continue
				}
				for _, n := range vs.Names {
					if n.Name == name {
						return true
					}
				}
			}
		}
	}
	return false
}

func TestDockerfileStages(t *testing.T) {
	b := parseDockerfile(t, "../Dockerfile")
	if !b.cgo0 {
		t.Error("the build stage does not set CGO_ENABLED=0")
	}
	for _, name := range []string{"kvrouter", "vllm-sim"} {
		t.Run(name, func(t *testing.T) {
			s, ok := b.final[name]
			if !ok {
				t.Fatalf("no stage %q", name)
			}
			if !strings.HasPrefix(s.from, "gcr.io/distroless/static") {
				t.Errorf("base %q is not distroless/static", s.from)
			}
			if s.user == "" || s.user == "root" || strings.HasPrefix(s.user, "0") {
				t.Errorf("runs as %q, want a non-root user", s.user)
			}
			if !strings.Contains(strings.Join(b.pkgs, " "), "/cmd/"+name) {
				t.Errorf("the build stage does not build cmd/%s: %v", name, b.pkgs)
			}
		})
	}
}
