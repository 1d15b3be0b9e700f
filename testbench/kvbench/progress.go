package kvbench

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// Progress draws a progress bar: redrawn in place on a terminal, or, on anything else, one
// line every few seconds once the run has lasted longer than Quiet. It is safe for
// concurrent use.
type Progress struct {
	mu       sync.Mutex
	w        io.Writer
	terminal bool
	label    string
	total    int
	done     int
	start    time.Time
	last     time.Time
	printed  bool
	now      func() time.Time
	// Quiet is how long a run on a non-terminal stays silent; Every the interval of its
	// lines after that.
	Quiet, Every time.Duration
}

// NewProgress returns a bar of total steps writing to w; terminal selects in-place
// redrawing. now is the clock (nil = time.Now).
func NewProgress(w io.Writer, terminal bool, label string, total int, now func() time.Time) *Progress {
	if now == nil {
		now = time.Now
	}
	t := now()
	return &Progress{w: w, terminal: terminal, label: label, total: total, start: t, last: t, now: now,
		Quiet: 3 * time.Second, Every: 5 * time.Second}
}

// Add records n finished steps and redraws when due.
func (p *Progress) Add(n int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.done += n
	t := p.now()
	switch {
	case p.terminal:
		if t.Sub(p.last) < 100*time.Millisecond && p.done < p.total {
			return
		}
		fmt.Fprintf(p.w, "\r%s", p.line(t))
	case t.Sub(p.start) >= p.Quiet && (!p.printed || t.Sub(p.last) >= p.Every || p.done == p.total):
		fmt.Fprintln(p.w, p.line(t))
		p.printed = true
	default:
		return
	}
	p.last = t
}

// Finish ends the bar's line on a terminal.
func (p *Progress) Finish() {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.terminal {
		fmt.Fprintf(p.w, "\r%s\n", p.line(p.now()))
	}
}

func (p *Progress) line(t time.Time) string {
	const width = 30
	frac := 1.0
	if p.total > 0 {
		frac = float64(p.done) / float64(p.total)
	}
	filled := int(frac * width)
	elapsed := t.Sub(p.start)
	eta := "?"
	if p.done > 0 {
		eta = (time.Duration(float64(elapsed)/frac) - elapsed).Round(time.Second).String()
	}
	return fmt.Sprintf("%s [%s%s] %d/%d %3.0f%% elapsed %s eta %s", p.label,
		strings.Repeat("#", filled), strings.Repeat(".", width-filled), p.done, p.total, frac*100,
		elapsed.Round(time.Second), eta)
}
