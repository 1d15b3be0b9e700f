//go:build !race

package app_test

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/kvrouter/kvrouter/internal/testtext"
	"github.com/kvrouter/kvrouter/testbench/fakeenvoy"
	"github.com/kvrouter/kvrouter/tokenizer/testmodels"
)

// TestPeakRSSUnderHugeBodies sends 24 parallel 15 MB chat bodies to kvrouter running as
// a process with a real tokenizer and the Helm chart's GC settings (GOGC=400, GOMEMLIMIT
// at the chart's 2 GiB container limit), and checks that its peak resident set (the
// kernel's VmHWM) stays within 2x its idle resident set (after start-up, tokenizer
// loaded) plus limits.body_budget_bytes: the budget bounds the bodies held and parsed
// at once (charged extproc.ParseCost times their bytes), the token limit bounds the
// tokenizer's work, the rest stream through, and the soft memory limit kvrouter keeps
// (2x its live heap + the budget) bounds the garbage GOGC=400 would let pile up. Every
// request is routed; at least one is parsed.
//
// Not under -race (the race detector's shadow memory is part of the RSS): `make test`
// runs it in its own line without -race. KVROUTER_TEST_CHILD_ENV adds one variable to
// kvrouter's environment (e.g. GODEBUG=gctrace=1, with KVROUTER_TEST_CHILD_LOG=1).
func TestPeakRSSUnderHugeBodies(t *testing.T) {
	if testing.Short() {
		t.Skip("sends 360 MB through a kvrouter process")
	}
	const budget = 112 << 20 // the default: one 15 MB body parsed (6 x 15 MB = 90 MB) and rewritten (+15 MB) at a time
	dir := testmodels.Dir(t, "qwen3")
	cfg := childConfig(fmt.Sprintf("  body_budget_bytes: %d\n", budget)) + "models:\n  m:\n    tokenizer: " + dir + "\n"
	cfg = strings.Replace(cfg, "policy: {name: least-load}", "policy: {name: placement}", 1)
	env := []string{"GOGC=400", "GOMEMLIMIT=2GiB"} // charts/kvrouter/values.yaml: goGC, resources.limits.memory
	if e := os.Getenv("KVROUTER_TEST_CHILD_ENV"); e != "" {
		env = append(env, e)
	}
	c := startChild(t, "", cfg, env...)
	pid := c.cmd.Process.Pid

	cc, err := grpc.NewClient(c.extproc, grpc.WithTransportCredentials(insecure.NewCredentials()))
	if err != nil {
		t.Fatal(err)
	}
	defer cc.Close()
	client := extprocv3.NewExternalProcessorClient(cc)
	send := func(body []byte) error {
		x, err := fakeenvoy.Start(context.Background(), client, fakeenvoy.FullDuplex())
		if err != nil {
			return err
		}
		defer x.Cancel()
		var chunks [][]byte
		size := strconv.Itoa(len(body))
		for len(body) > 0 {
			n := min(len(body), 64<<10)
			chunks = append(chunks, body[:n])
			body = body[n:]
		}
		res, err := x.Request(fakeenvoy.Request{Headers: fakeenvoy.Headers{{Key: ":method", Value: "POST"},
			{Key: ":path", Value: "/v1/chat/completions"}, {Key: "content-type", Value: "application/json"},
			{Key: "content-length", Value: size}}, Body: chunks})
		if err == nil && res.Immediate != nil {
			err = fmt.Errorf("answered %d instead of routed", res.Immediate.GetStatus().GetCode())
		}
		return err
	}
	// One small request first, so that idle includes what every request warms up (the
	// tokenizer is loaded on first use).
	if err := send([]byte(`{"model":"m","messages":[{"role":"user","content":"hello"}]}`)); err != nil {
		t.Fatal(err)
	}
	idle := procStatus(t, pid, "VmRSS")

	huge := []byte(`{"model":"m","messages":[{"role":"user","content":"` + strings.ReplaceAll(testtext.Prose(1, 4_100_000), "\n", "\\n") + `"}]}`)
	const parallel = 24
	errs := make(chan error, parallel)
	for range parallel {
		go func() { errs <- send(huge) }()
	}
	for range parallel {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	peak := procStatus(t, pid, "VmHWM")
	overBudget := scrapeCounter(t, c.admin, `kvrouter_request_parse_errors_total{reason="body_budget"}`)
	t.Logf("%d-byte bodies: idle RSS %d MiB, peak RSS %d MiB, budget %d MiB, bound 2 x idle + budget = %d MiB; %d of %d over the budget (routed by load)",
		len(huge), idle>>20, peak>>20, budget>>20, (2*idle+budget)>>20, overBudget, parallel)
	if overBudget >= parallel {
		t.Fatalf("all %d bodies were over the budget: none was parsed", parallel)
	}
	if peak > 2*idle+budget {
		t.Fatalf("peak RSS %d MiB > 2 x idle %d MiB + budget %d MiB", peak>>20, idle>>20, budget>>20)
	}
}

// scrapeCounter reads one sample (name with its labels, as exposed) from the admin
// port's /metrics; 0 when absent.
func scrapeCounter(t *testing.T, admin, sample string) int {
	t.Helper()
	resp, err := http.Get("http://" + admin + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^` + regexp.QuoteMeta(sample) + ` (\S+)$`).FindSubmatch(b)
	if m == nil {
		return 0
	}
	v, err := strconv.ParseFloat(string(m[1]), 64)
	if err != nil {
		t.Fatal(err)
	}
	return int(v)
}
