package kvbench

import (
	"fmt"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"
)

// WriteTables writes the sweep's Markdown tables in the reference experiment's layout:
// request hit rate at concurrency 8, cached-token ratio at 4 and 16, servers per prefix at
// 4, TTFT p50/p99 at 4 and 16, throughput at 16, the kv policy against the bound, and the
// cached-token ratio of every policy at 8 beside the bound. A table whose concurrency is
// not in the grid falls back to the grid's concurrencies. kvPolicy names the policy the
// bound table shows.
func WriteTables(w io.Writer, results []CellResult, kvPolicy string) error {
	ix := indexResults(results)
	if len(ix.policies) == 0 {
		return fmt.Errorf("kvbench: no results to report")
	}
	workers := results[0].Workers
	var b strings.Builder
	conc := func(want ...int) []int {
		var out []int
		for _, c := range want {
			if slices.Contains(ix.concurrency, c) {
				out = append(out, c)
			}
		}
		if len(out) == 0 {
			return ix.concurrency
		}
		return out
	}
	concList := func(cs []int) string {
		parts := make([]string, len(cs))
		for i, c := range cs {
			parts[i] = strconv.Itoa(c)
		}
		return strings.Join(parts, " / ")
	}
	perPolicy := func(title string, cs []int, withConc bool, cell func(*Summary) string, extra ...column) {
		fmt.Fprintf(&b, "%s\n\n", title)
		header := []string{"N"}
		if withConc {
			header = append(header, "conc")
		}
		header = append(header, ix.policies...)
		for _, e := range extra {
			header = append(header, e.name)
		}
		var rows [][]string
		for _, c := range cs {
			for _, n := range ix.prefixes {
				row := []string{strconv.Itoa(n)}
				if withConc {
					row = append(row, strconv.Itoa(c))
				}
				for _, p := range ix.policies {
					row = append(row, orDash(ix.get(p, n, c), cell))
				}
				for _, e := range extra {
					row = append(row, e.value(n, c))
				}
				rows = append(rows, row)
			}
		}
		writeTable(&b, header, rows)
		b.WriteString("\n")
	}
	boundCell := func(n, c int) string {
		for _, p := range ix.policies {
			if s := ix.get(p, n, c); s != nil {
				return fmt.Sprintf("%.3f", s.BoundCachedRatio)
			}
		}
		return "-"
	}

	fmt.Fprintf(&b, "## Results, %d workers\n\n", workers)
	for _, c := range conc(8) {
		perPolicy(fmt.Sprintf("Request hit rate (share of requests with any cached token), concurrency %d:", c),
			[]int{c}, false, func(s *Summary) string { return pct(s.HitAny, 1) })
		perPolicy(fmt.Sprintf("Request hit rate, whole shared prefix cached, concurrency %d:", c),
			[]int{c}, false, func(s *Summary) string { return pct(s.HitFull, 1) })
	}
	maxRatio := ""
	if len(results) > 0 {
		s := results[0].Median
		if s.BoundHitRate > 0 {
			maxRatio = fmt.Sprintf("; max %.3f", s.BoundCachedRatio/s.BoundHitRate)
		}
	}
	perPolicy(fmt.Sprintf("Cached-token ratio (cached prompt tokens / prompt tokens%s):", maxRatio),
		conc(4, 16), true, func(s *Summary) string { return fmt.Sprintf("%.3f", s.CachedRatio) })
	for _, c := range conc(4) {
		perPolicy(fmt.Sprintf("Distinct servers that served one prefix, concurrency %d:", c),
			[]int{c}, false, func(s *Summary) string {
				if s.ServersPerPrefix == nil {
					return "-"
				}
				return fmt.Sprintf("%.2f", *s.ServersPerPrefix)
			})
	}
	perPolicy("TTFT p50 / p99 in ms:", conc(4, 16), true, func(s *Summary) string {
		return thousands(s.TTFTP50Ms) + " / " + thousands(s.TTFTP99Ms)
	})
	for _, c := range conc(16) {
		perPolicy(fmt.Sprintf("Throughput, requests/s, concurrency %d:", c), []int{c}, false,
			func(s *Summary) string { return fmt.Sprintf("%.1f", s.Throughput) })
	}
	if slices.Contains(ix.policies, kvPolicy) {
		cs := conc(4, 8, 16)
		fmt.Fprintf(&b, "Request hit rate against the bound (%s, concurrency %s):\n\n", kvPolicy, concList(cs))
		var rows [][]string
		for _, n := range ix.prefixes {
			bound := "-"
			var vals []string
			for _, c := range cs {
				s := ix.get(kvPolicy, n, c)
				if s == nil {
					vals = append(vals, "-")
					continue
				}
				bound = pct(s.BoundHitRate, 0)
				vals = append(vals, fmt.Sprintf("%.0f", s.HitAny*100))
			}
			rows = append(rows, []string{strconv.Itoa(n), bound, strings.Join(vals, " / ") + "%"})
		}
		writeTable(&b, []string{"N", "bound", kvPolicy}, rows)
		b.WriteString("\n")
	}
	for _, c := range conc(8) {
		perPolicy(fmt.Sprintf("Cached-token ratio, every policy against the bound, concurrency %d:", c),
			[]int{c}, false, func(s *Summary) string { return fmt.Sprintf("%.3f", s.CachedRatio) },
			column{"bound", boundCell})
	}
	if hasDecision(results) {
		for _, c := range conc(8) {
			perPolicy(fmt.Sprintf("Router decision latency p50 / p99 in µs, concurrency %d:", c), []int{c}, false,
				func(s *Summary) string {
					if s.DecisionP50Us == nil {
						return "-"
					}
					return fmt.Sprintf("%.1f / %.1f", *s.DecisionP50Us, *s.DecisionP99Us)
				})
		}
	}
	errs := 0
	for _, r := range results {
		errs += r.Median.Errors
	}
	fmt.Fprintf(&b, "Errors: %d in %d cells.\n", errs, len(results))
	for _, r := range results {
		if r.Median.FirstError != "" {
			fmt.Fprintf(&b, "First error, %s: %s\n", r.Cell, r.Median.FirstError)
			break
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// WriteSummary writes one cell's repetitions and median as a Markdown table.
func WriteSummary(w io.Writer, r CellResult) error {
	var b strings.Builder
	fmt.Fprintf(&b, "%s\n\n", r.Cell)
	header := []string{"run", "hit_any", "hit_full", "cached_ratio", "ttft p50 / p99 ms", "req/s", "errors",
		"servers/prefix", "decision p50 / p99 µs", "engine hit rate"}
	var rows [][]string
	line := func(name string, s Summary) []string {
		return []string{name, pct(s.HitAny, 1), pct(s.HitFull, 1), fmt.Sprintf("%.3f", s.CachedRatio),
			thousands(s.TTFTP50Ms) + " / " + thousands(s.TTFTP99Ms), fmt.Sprintf("%.1f", s.Throughput),
			strconv.Itoa(s.Errors), optF(s.ServersPerPrefix, "%.2f"), optPair(s.DecisionP50Us, s.DecisionP99Us),
			optPct(s.EngineHitRate)}
	}
	for i, s := range r.Reps {
		rows = append(rows, line(fmt.Sprintf("rep %d", i+1), s))
	}
	if len(r.Reps) > 1 {
		rows = append(rows, line("median", r.Median))
	}
	writeTable(&b, header, rows)
	fmt.Fprintf(&b, "\nbound: hit rate %s, cached-token ratio %.3f\n", pct(r.Median.BoundHitRate, 1), r.Median.BoundCachedRatio)
	if r.Median.FirstError != "" {
		fmt.Fprintf(&b, "first error: %s\n", r.Median.FirstError)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

type column struct {
	name  string
	value func(n, c int) string
}

func hasDecision(results []CellResult) bool {
	for _, r := range results {
		if r.Median.DecisionP50Us != nil {
			return true
		}
	}
	return false
}

// writeTable writes a Markdown table whose cells are padded to their column's width.
func writeTable(b *strings.Builder, header []string, rows [][]string) {
	width := make([]int, len(header))
	for i, h := range header {
		width[i] = len([]rune(h))
	}
	for _, r := range rows {
		for i, c := range r {
			width[i] = max(width[i], len([]rune(c)))
		}
	}
	line := func(cells []string) {
		b.WriteString("|")
		for i, c := range cells {
			fmt.Fprintf(b, " %s%s |", c, strings.Repeat(" ", width[i]-len([]rune(c))))
		}
		b.WriteString("\n")
	}
	line(header)
	b.WriteString("|")
	for _, wd := range width {
		b.WriteString(strings.Repeat("-", wd+2) + "|")
	}
	b.WriteString("\n")
	for _, r := range rows {
		line(r)
	}
}

func orDash(s *Summary, f func(*Summary) string) string {
	if s == nil {
		return "-"
	}
	return f(s)
}

func pct(x float64, decimals int) string {
	return strconv.FormatFloat(x*100, 'f', decimals, 64) + "%"
}

func optF(x *float64, format string) string {
	if x == nil {
		return "-"
	}
	return fmt.Sprintf(format, *x)
}

func optPct(x *float64) string {
	if x == nil {
		return "-"
	}
	return pct(*x, 1)
}

func optPair(a, b *float64) string {
	if a == nil || b == nil {
		return "-"
	}
	return fmt.Sprintf("%.1f / %.1f", *a, *b)
}

// thousands formats a rounded number with comma separators: 1353.4 -> "1,353".
func thousands(x float64) string {
	if math.IsNaN(x) || math.IsInf(x, 0) {
		return "-"
	}
	s := strconv.FormatInt(int64(math.Round(x)), 10)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var out []byte
	for i := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			out = append(out, ',')
		}
		out = append(out, s[i])
	}
	if neg {
		return "-" + string(out)
	}
	return string(out)
}
