package examples

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// readmeSections are the sections every package README has, in this order (house style:
// what it does, configuration, metrics, examples). A heading matches when it starts with
// the name ("Configuration (`replicas:` section)"); other sections may come between them.
var readmeSections = []string{"What it does", "Configuration", "Metrics", "Examples"}

// readmeExempt are the packages whose README is not a package README, with the reason.
var readmeExempt = map[string]string{
	"examples": "the package holds no code, only the tests of the manifests; its README is the deployment guide for them",
}

// checkSections reports the first required section that is missing, out of order or
// empty (no text before the next heading) in the Markdown text.
func checkSections(text string) error {
	type section struct {
		name  string
		empty bool
	}
	var found []section
	inCode := false
	for _, line := range strings.Split(text, "\n") {
		if strings.HasPrefix(line, "```") {
			inCode = !inCode
		}
		switch {
		case !inCode && strings.HasPrefix(line, "## "):
			found = append(found, section{name: strings.TrimPrefix(line, "## "), empty: true})
		case !inCode && strings.HasPrefix(line, "#"):
			if len(found) > 0 && strings.HasPrefix(line, "### ") {
				found[len(found)-1].empty = false // a subsection is content
			}
		case len(found) > 0 && strings.TrimSpace(line) != "":
			found[len(found)-1].empty = false
		}
	}
	i := 0
	for _, want := range readmeSections {
		for i < len(found) && !strings.HasPrefix(found[i].name, want) {
			i++
		}
		if i == len(found) {
			return fmt.Errorf("no %q section after the previous required one (sections in order: %s)",
				"## "+want, strings.Join(readmeSections, ", "))
		}
		if found[i].empty {
			return fmt.Errorf("section %q is empty", "## "+found[i].name)
		}
		i++
	}
	return nil
}

func TestCheckSections(t *testing.T) {
	full := "# p\n\n## What it does\nA.\n\n## Configuration\nNone.\n\n## Metrics\nNone.\n\n## Examples\n```go\nx()\n```\n"
	tests := []struct {
		name, text string
		wantErr    string
	}{
		{"all four", full, ""},
		{"suffix and extra sections", strings.Replace(strings.Replace(full, "## Configuration", "## Configuration (`x:` section)", 1),
			"## Metrics", "## Fidelity\nB.\n\n## Metrics", 1), ""},
		{"subsection counts as content", strings.Replace(full, "## Configuration\nNone.", "## Configuration\n### Derived\nC.", 1), ""},
		{"missing", strings.Replace(full, "## Metrics\nNone.\n\n", "", 1), `no "## Metrics" section`},
		{"out of order", "## What it does\nA.\n## Metrics\nN.\n## Configuration\nN.\n## Examples\nE.\n", `no "## Metrics" section`},
		{"empty", strings.Replace(full, "## Metrics\nNone.", "## Metrics\n", 1), `section "## Metrics" is empty`},
		{"heading inside code is not a section", "## What it does\nA.\n```\n## Configuration\n```\n## Metrics\nN.\n## Examples\nE.\n", `no "## Configuration" section`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := checkSections(tc.text)
			switch {
			case tc.wantErr == "" && err != nil:
				t.Fatalf("unexpected error: %v", err)
			case tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)):
				t.Fatalf("error %v, want one containing %q", err, tc.wantErr)
			}
		})
	}
}

// packageDirs lists the directories under root holding Go files, skipping those the go
// command skips (testdata, and names starting with "." or "_").
func packageDirs(t *testing.T, root string) []string {
	t.Helper()
	seen := map[string]bool{}
	var dirs []string
	err := filepath.WalkDir(root, func(path string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		name := d.Name()
		if d.IsDir() {
			if path != root && (name == "testdata" || strings.HasPrefix(name, ".") || strings.HasPrefix(name, "_")) {
				return filepath.SkipDir
			}
			return nil
		}
		if dir := filepath.Dir(path); strings.HasSuffix(name, ".go") && !seen[dir] {
			seen[dir] = true
			dirs = append(dirs, dir)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	return dirs
}

// TestEveryPackageHasAREADME: every Go package of the module has a README.md with the
// house sections (What it does, Configuration, Metrics, Examples), each with some text.
func TestEveryPackageHasAREADME(t *testing.T) {
	root := ".."
	dirs := packageDirs(t, root)
	if len(dirs) < 10 {
		t.Fatalf("found only %d package directories under %s: the walk is broken", len(dirs), root)
	}
	for _, dir := range dirs {
		rel, err := filepath.Rel(root, dir)
		if err != nil {
			t.Fatal(err)
		}
		rel = filepath.ToSlash(rel)
		t.Run(rel, func(t *testing.T) {
			if why, ok := readmeExempt[rel]; ok {
				t.Skip(why)
			}
			b, err := os.ReadFile(filepath.Join(dir, "README.md"))
			if err != nil {
				t.Fatalf("%s has no README.md: write one with the sections %s (house style)",
					rel, strings.Join(readmeSections, ", "))
			}
			if err := checkSections(string(b)); err != nil {
				t.Errorf("%s/README.md: %v", rel, err)
			}
		})
	}
}
