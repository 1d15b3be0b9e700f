package kvbench

import (
	"bytes"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"io"
	"math"
	"slices"
	"strconv"
	"strings"

	"golang.org/x/image/font"
	"golang.org/x/image/font/basicfont"
	"golang.org/x/image/math/fixed"
)

// PlotSeries is one line of the plot: y per x, in x order.
type PlotSeries struct {
	Name   string
	X, Y   []float64
	Dashed bool
}

// Plot is a line chart of cached-token ratio against the number of prefixes.
type Plot struct {
	Title  string
	XLabel string
	YLabel string
	Series []PlotSeries
}

// CachedRatioPlot builds the chart of cached-token ratio vs N at the given concurrency
// (the first in the grid if it has no such concurrency): one line per policy and the
// bound, dashed.
func CachedRatioPlot(results []CellResult, concurrency int) Plot {
	ix := indexResults(results)
	if !slices.Contains(ix.concurrency, concurrency) && len(ix.concurrency) > 0 {
		concurrency = ix.concurrency[0]
	}
	workers := 0
	if len(results) > 0 {
		workers = results[0].Workers
	}
	p := Plot{
		Title:  fmt.Sprintf("Cached-token ratio vs prefixes (%d workers, concurrency %d)", workers, concurrency),
		XLabel: "prefixes (N)",
		YLabel: "cached-token ratio",
	}
	bound := PlotSeries{Name: "bound", Dashed: true}
	for _, pol := range ix.policies {
		s := PlotSeries{Name: pol}
		for _, n := range ix.prefixes {
			if c := ix.get(pol, n, concurrency); c != nil {
				s.X = append(s.X, float64(n))
				s.Y = append(s.Y, c.CachedRatio)
			}
		}
		p.Series = append(p.Series, s)
	}
	for _, n := range ix.prefixes {
		for _, pol := range ix.policies {
			if c := ix.get(pol, n, concurrency); c != nil {
				bound.X = append(bound.X, float64(n))
				bound.Y = append(bound.Y, c.BoundCachedRatio)
				break
			}
		}
	}
	p.Series = append(p.Series, bound)
	return p
}

var palette = []color.RGBA{
	{0x1f, 0x77, 0xb4, 0xff}, {0xff, 0x7f, 0x0e, 0xff}, {0x2c, 0xa0, 0x2c, 0xff},
	{0xd6, 0x27, 0x28, 0xff}, {0x94, 0x67, 0xbd, 0xff}, {0x8c, 0x56, 0x4b, 0xff},
	{0xe3, 0x77, 0xc2, 0xff}, {0x17, 0xbe, 0xcf, 0xff},
}

var boundColor = color.RGBA{0x44, 0x44, 0x44, 0xff}

// layout holds the chart geometry shared by the SVG and PNG renderers.
type layout struct {
	w, h                   float64
	left, right, top, bott float64
	xmin, xmax, ymax       float64
	xticks, yticks         []float64
}

func (p Plot) layout() layout {
	l := layout{w: 720, h: 450, left: 70, right: 170, top: 50, bott: 60, xmin: math.Inf(1), xmax: math.Inf(-1)}
	for _, s := range p.Series {
		for i := range s.X {
			l.xmin = math.Min(l.xmin, s.X[i])
			l.xmax = math.Max(l.xmax, s.X[i])
			l.ymax = math.Max(l.ymax, s.Y[i])
		}
	}
	if math.IsInf(l.xmin, 0) {
		l.xmin, l.xmax = 0, 1
	}
	if l.xmax == l.xmin {
		l.xmin, l.xmax = l.xmin-1, l.xmax+1
	}
	l.ymax = math.Max(0.1, math.Ceil(l.ymax*10)/10)
	seen := map[float64]bool{}
	for _, s := range p.Series {
		for _, x := range s.X {
			if !seen[x] {
				seen[x] = true
				l.xticks = append(l.xticks, x)
			}
		}
	}
	slices.Sort(l.xticks)
	step := 0.1
	if l.ymax > 0.5 {
		step = 0.2
	}
	for y := 0.0; y <= l.ymax+1e-9; y += step {
		l.yticks = append(l.yticks, math.Round(y*100)/100)
	}
	return l
}

func (l layout) px(x float64) float64 {
	return l.left + (x-l.xmin)/(l.xmax-l.xmin)*(l.w-l.left-l.right)
}

func (l layout) py(y float64) float64 {
	return l.h - l.bott - y/l.ymax*(l.h-l.top-l.bott)
}

func (p Plot) colorOf(i int) color.RGBA {
	if p.Series[i].Dashed {
		return boundColor
	}
	return palette[i%len(palette)]
}

func hex(c color.RGBA) string { return fmt.Sprintf("#%02x%02x%02x", c.R, c.G, c.B) }

// WriteSVG draws the plot as a standalone SVG document.
func (p Plot) WriteSVG(w io.Writer) error {
	l := p.layout()
	var b strings.Builder
	esc := func(s string) string {
		r := strings.NewReplacer("&", "&amp;", "<", "&lt;", ">", "&gt;", `"`, "&quot;")
		return r.Replace(s)
	}
	f := func(x float64) string { return strconv.FormatFloat(x, 'f', 1, 64) }
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%s" height="%s" viewBox="0 0 %s %s" font-family="sans-serif" font-size="12">`+"\n",
		f(l.w), f(l.h), f(l.w), f(l.h))
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%s" y="22" text-anchor="middle" font-size="14">%s</text>`+"\n", f((l.left+l.w-l.right)/2), esc(p.Title))
	x0, x1, y0, y1 := l.left, l.w-l.right, l.h-l.bott, l.top
	for _, y := range l.yticks {
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#e0e0e0"/>`+"\n", f(x0), f(l.py(y)), f(x1), f(l.py(y)))
		fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="end">%s</text>`+"\n", f(x0-6), f(l.py(y)+4), strconv.FormatFloat(y, 'f', 1, 64))
	}
	for _, x := range l.xticks {
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="#e0e0e0"/>`+"\n", f(l.px(x)), f(y0), f(l.px(x)), f(y1))
		fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n", f(l.px(x)), f(y0+18), strconv.FormatFloat(x, 'f', -1, 64))
	}
	fmt.Fprintf(&b, `<polyline points="%s,%s %s,%s %s,%s" fill="none" stroke="black"/>`+"\n", f(x0), f(y1), f(x0), f(y0), f(x1), f(y0))
	fmt.Fprintf(&b, `<text x="%s" y="%s" text-anchor="middle">%s</text>`+"\n", f((x0+x1)/2), f(l.h-16), esc(p.XLabel))
	fmt.Fprintf(&b, `<text x="18" y="%s" text-anchor="middle" transform="rotate(-90 18 %s)">%s</text>`+"\n", f((y0+y1)/2), f((y0+y1)/2), esc(p.YLabel))
	for i, s := range p.Series {
		c := hex(p.colorOf(i))
		dash := ""
		if s.Dashed {
			dash = ` stroke-dasharray="6 4"`
		}
		var pts []string
		for j := range s.X {
			pts = append(pts, f(l.px(s.X[j]))+","+f(l.py(s.Y[j])))
		}
		fmt.Fprintf(&b, `<polyline points="%s" fill="none" stroke="%s" stroke-width="2"%s/>`+"\n", strings.Join(pts, " "), c, dash)
		if !s.Dashed {
			for j := range s.X {
				fmt.Fprintf(&b, `<circle cx="%s" cy="%s" r="3.5" fill="%s"/>`+"\n", f(l.px(s.X[j])), f(l.py(s.Y[j])), c)
			}
		}
		ly := l.top + 10 + float64(i)*20
		fmt.Fprintf(&b, `<line x1="%s" y1="%s" x2="%s" y2="%s" stroke="%s" stroke-width="2"%s/>`+"\n", f(x1+16), f(ly), f(x1+40), f(ly), c, dash)
		fmt.Fprintf(&b, `<text x="%s" y="%s">%s</text>`+"\n", f(x1+46), f(ly+4), esc(s.Name))
	}
	b.WriteString("</svg>\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// WritePNG draws the plot with the standard library's image and image/png and a simple
// rasteriser (thick lines by stamping discs; labels in x/image's fixed 7x13 bitmap font).
func (p Plot) WritePNG(w io.Writer) error {
	l := p.layout()
	img := image.NewRGBA(image.Rect(0, 0, int(l.w), int(l.h)))
	for i := range img.Pix {
		img.Pix[i] = 0xff
	}
	x0, x1, y0, y1 := l.left, l.w-l.right, l.h-l.bott, l.top
	grid := color.RGBA{0xe0, 0xe0, 0xe0, 0xff}
	black := color.RGBA{0, 0, 0, 0xff}
	for _, y := range l.yticks {
		drawLine(img, x0, l.py(y), x1, l.py(y), 0.5, grid, false)
		label := strconv.FormatFloat(y, 'f', 1, 64)
		drawText(img, x0-6-float64(textWidth(label)), l.py(y)+4, label)
	}
	for _, x := range l.xticks {
		drawLine(img, l.px(x), y0, l.px(x), y1, 0.5, grid, false)
		label := strconv.FormatFloat(x, 'f', -1, 64)
		drawText(img, l.px(x)-float64(textWidth(label))/2, y0+18, label)
	}
	drawLine(img, x0, y1, x0, y0, 0.6, black, false)
	drawLine(img, x0, y0, x1, y0, 0.6, black, false)
	drawText(img, (l.left+l.w-l.right)/2-float64(textWidth(p.Title))/2, 22, p.Title)
	drawText(img, (x0+x1)/2-float64(textWidth(p.XLabel))/2, l.h-16, p.XLabel)
	drawText(img, 8, y1-14, p.YLabel)
	for i, s := range p.Series {
		c := p.colorOf(i)
		for j := 1; j < len(s.X); j++ {
			drawLine(img, l.px(s.X[j-1]), l.py(s.Y[j-1]), l.px(s.X[j]), l.py(s.Y[j]), 1.2, c, s.Dashed)
		}
		if !s.Dashed {
			for j := range s.X {
				disc(img, l.px(s.X[j]), l.py(s.Y[j]), 3.5, c)
			}
		}
		ly := l.top + 10 + float64(i)*20
		drawLine(img, x1+16, ly, x1+40, ly, 1.2, c, s.Dashed)
		drawText(img, x1+46, ly+4, s.Name)
	}
	var buf bytes.Buffer
	if err := png.Encode(&buf, img); err != nil {
		return fmt.Errorf("kvbench: encoding png: %w", err)
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// drawLine stamps discs of radius r every half pixel from (ax, ay) to (bx, by); dashed
// lines skip every other 10-pixel stretch.
func drawLine(img *image.RGBA, ax, ay, bx, by, r float64, c color.RGBA, dashed bool) {
	length := math.Hypot(bx-ax, by-ay)
	steps := int(length*2) + 1
	for i := 0; i <= steps; i++ {
		t := float64(i) / float64(steps)
		if dashed && int(t*length/10)%2 == 1 {
			continue
		}
		disc(img, ax+t*(bx-ax), ay+t*(by-ay), r, c)
	}
}

func disc(img *image.RGBA, cx, cy, r float64, c color.RGBA) {
	for y := int(math.Floor(cy - r)); y <= int(math.Ceil(cy+r)); y++ {
		for x := int(math.Floor(cx - r)); x <= int(math.Ceil(cx+r)); x++ {
			if (float64(x)-cx)*(float64(x)-cx)+(float64(y)-cy)*(float64(y)-cy) <= r*r+0.25 {
				if image.Pt(x, y).In(img.Rect) {
					img.SetRGBA(x, y, c)
				}
			}
		}
	}
}

func textWidth(s string) int { return font.MeasureString(basicfont.Face7x13, s).Round() }

func drawText(img *image.RGBA, x, y float64, s string) {
	d := font.Drawer{
		Dst:  img,
		Src:  image.NewUniform(color.Black),
		Face: basicfont.Face7x13,
		Dot:  fixed.P(int(x), int(y)),
	}
	d.DrawString(s)
}
