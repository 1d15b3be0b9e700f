package app

import (
	"bytes"
	"testing"
)

// The linker's buildVersion and buildCommit (the Dockerfile's VERSION and COMMIT) name
// the build in kvrouter --version and inference_extension_info; unset, Go's record does.
func TestVersionFromLinker(t *testing.T) {
	defer func(v, c string) { buildVersion, buildCommit = v, c }(buildVersion, buildCommit)
	buildVersion, buildCommit = "", ""
	var out bytes.Buffer
	Main([]string{"--version"}, &out, &out)
	unset := out.String()
	if unset == "kvrouter v1.2.3 (commit 0123abc)\n" {
		t.Fatalf("--version %q without the linker's values", unset)
	}
	buildVersion, buildCommit = "v1.2.3", "0123abc"
	out.Reset()
	if code := Main([]string{"--version"}, &out, &out); code != 0 || out.String() != "kvrouter v1.2.3 (commit 0123abc)\n" {
		t.Errorf("--version exit %d, %q; want kvrouter v1.2.3 (commit 0123abc)", code, out.String())
	}
	if ref, commit := buildInfo(); ref != "v1.2.3" || commit != "0123abc" {
		t.Errorf("inference_extension_info's build_ref %q, commit %q", ref, commit)
	}
}
