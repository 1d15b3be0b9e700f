package examples_test

import (
	"debug/elf"
	"os"
	"os/exec"
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
			if !strings.Contains(strings.Join(b.pkgs, " "), "./cmd/"+name) {
				t.Errorf("the build stage does not build ./cmd/%s: %v", name, b.pkgs)
			}
		})
	}
}

// TestDockerfileBuildsStatic runs the build stage's go build (same flags,
// CGO_ENABLED=0) and checks that every binary is a static ELF: no program interpreter,
// no shared library. It takes a minute on a cold build cache: skipped with -short.
func TestDockerfileBuildsStatic(t *testing.T) {
	if testing.Short() {
		t.Skip("builds the release binaries; run without -short")
	}
	b := parseDockerfile(t, "../Dockerfile")
	if len(b.flags) == 0 || len(b.pkgs) == 0 {
		t.Fatalf("no go build command found: %+v", b)
	}
	var pkgs []string
	for _, p := range b.pkgs {
		if _, err := os.Stat(filepath.Join("..", p)); err != nil {
			// vllm-sim lives on the sim branch until it is merged.
			t.Logf("%s is not in this tree: not built", p)
			continue
		}
		pkgs = append(pkgs, p)
	}
	if len(pkgs) == 0 || pkgs[0] != "./cmd/kvrouter" {
		t.Fatalf("./cmd/kvrouter must be built, found %v", pkgs)
	}
	out := t.TempDir()
	args := append(append([]string{"build"}, b.flags...), "-o", out+"/")
	args = append(args, pkgs...)
	cmd := exec.Command("go", args...)
	cmd.Dir = ".."
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0")
	if msg, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go %s: %v\n%s", strings.Join(args, " "), err, msg)
	}
	for _, p := range pkgs {
		bin := filepath.Join(out, filepath.Base(p))
		t.Run(filepath.Base(p), func(t *testing.T) {
			f, err := elf.Open(bin)
			if err != nil {
				t.Fatal(err)
			}
			defer f.Close()
			for _, prog := range f.Progs {
				if prog.Type == elf.PT_INTERP {
					t.Errorf("%s has a program interpreter: not static", bin)
				}
			}
			if libs, _ := f.ImportedLibraries(); len(libs) > 0 {
				t.Errorf("%s needs shared libraries %v", bin, libs)
			}
			if f.Section(".symtab") != nil {
				t.Errorf("%s keeps its symbol table: -ldflags -s was not applied", bin)
			}
		})
	}
}
