package app_test

import (
	"bufio"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/kvrouter/kvrouter/internal/app"
)

// envChild makes the test binary run kvrouter's command line instead of the tests, so
// that a test can start kvrouter as a real process (its own file limit, its own RSS).
const envChild = "KVROUTER_TEST_CHILD"

func TestMain(m *testing.M) {
	if os.Getenv(envChild) == "1" {
		os.Exit(app.Main(os.Args[1:], os.Stdout, os.Stderr))
	}
	os.Exit(m.Run())
}

// child is kvrouter running as a process.
type child struct {
	cmd            *exec.Cmd
	extproc, admin string
}

var servingLine = regexp.MustCompile(`"extproc":"([^"]+)".*"metrics":"([^"]+)"`)

// startChild runs kvrouter with cfg (YAML, listening on port 0) under sh with the given
// prefix (e.g. "ulimit -n 256;"), and waits for its "kvrouter serving" log line.
func startChild(t *testing.T, shPrefix, cfg string, env ...string) *child {
	t.Helper()
	path := filepath.Join(t.TempDir(), "kvrouter.yaml")
	if err := os.WriteFile(path, []byte(cfg), 0o644); err != nil {
		t.Fatal(err)
	}
	self, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command("sh", "-c", shPrefix+` exec "$0" --config "$1"`, self, path)
	cmd.Env = append(append(os.Environ(), envChild+"=1"), env...)
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	c := &child{cmd: cmd}
	sc := bufio.NewScanner(stderr)
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		if m := servingLine.FindStringSubmatch(sc.Text()); m != nil {
			c.extproc, c.admin = m[1], m[2]
			break
		}
	}
	if c.admin == "" {
		t.Fatalf("kvrouter did not start: %v", sc.Err())
	}
	go func() { // keep draining its log so that it never blocks on a full pipe
		for sc.Scan() {
			if os.Getenv("KVROUTER_TEST_CHILD_LOG") == "1" {
				fmt.Fprintln(os.Stderr, sc.Text())
			}
		}
	}()
	return c
}

func childConfig(limits string) string {
	return `listen: {extproc: "127.0.0.1:0", health: "127.0.0.1:0", metrics: "127.0.0.1:0", tls: {mode: disabled}}
endpoints:
  - address: 127.0.0.1:1
    models: [m]
policy: {name: least-load}
limits:
` + limits
}

// TestAdminPortAnswersWhileExtProcIsFlooded opens more raw TCP connections to the
// ext_proc port than kvrouter's file limit allows and checks that the admin port still
// answers: accepted ext_proc connections are capped by limits.max_connections, the rest
// wait in the kernel's backlog without taking descriptors.
func TestAdminPortAnswersWhileExtProcIsFlooded(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a process and opens 400 connections")
	}
	const fileLimit, flood = 256, 400
	c := startChild(t, fmt.Sprintf("ulimit -n %d;", fileLimit), childConfig("  max_connections: 64\n"))
	var conns []net.Conn
	defer func() {
		for _, cn := range conns {
			cn.Close()
		}
	}()
	for range flood {
		cn, err := net.Dial("tcp", c.extproc)
		if err != nil {
			break // the backlog is full: the flood is as large as this machine allows
		}
		conns = append(conns, cn)
	}
	if len(conns) <= fileLimit {
		t.Skipf("only %d connections could be opened, not more than the file limit %d", len(conns), fileLimit)
	}
	// Give the server time to accept what it will (a wait, not an assertion on time).
	time.Sleep(500 * time.Millisecond)
	client := &http.Client{Timeout: 5 * time.Second}
	for _, path := range []string{"/healthz", "/metrics"} {
		resp, err := client.Get("http://" + c.admin + path)
		if err != nil {
			t.Fatalf("admin %s with %d ext_proc connections open: %v", path, len(conns), err)
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("admin %s: %s", path, resp.Status)
		}
	}
}

// procStatus reads a field of /proc/PID/status in bytes (VmRSS: resident now, VmHWM:
// the peak resident set since start).
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Skipf("no /proc: %v", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			var kb int64
			fmt.Sscanf(strings.TrimSpace(rest), "%d kB", &kb)
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}
