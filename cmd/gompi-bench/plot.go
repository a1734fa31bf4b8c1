package main

import (
	"bufio"
	"fmt"
	"math"
	"os"
	"strconv"
	"strings"
)

type series struct {
	label string
	xs    []int
	ys    []float64
}

// readCSV reads size,value lines (a header line and # comments are skipped).
func readCSV(path string) (series, error) {
	f, err := os.Open(path)
	if err != nil {
		return series{}, err
	}
	defer f.Close()
	var s series
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		a, b, ok := strings.Cut(line, ",")
		if !ok || strings.HasPrefix(line, "#") {
			continue
		}
		x, err1 := strconv.Atoi(strings.TrimSpace(a))
		y, err2 := strconv.ParseFloat(strings.TrimSpace(b), 64)
		if err1 != nil || err2 != nil {
			continue
		}
		s.xs, s.ys = append(s.xs, x), append(s.ys, y)
	}
	return s, sc.Err()
}

// plotSVG draws the measured curve (and the overlay) on log-log axes.
func plotSVG(cfg *config, unit string, xs []int, ys []float64) error {
	all := []series{{label: "gompi", xs: xs, ys: ys}}
	if cfg.overlay != "" {
		o, err := readCSV(cfg.overlay)
		if err != nil {
			return fmt.Errorf("--plot-overlay: %w", err)
		}
		o.label = cfg.label
		all = append(all, o)
	}
	const W, H, L, R, T, B = 720.0, 440.0, 80.0, 20.0, 30.0, 60.0
	minX, maxX, minY, maxY := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range all {
		for i := range s.xs {
			x, y := math.Log2(float64(max(1, s.xs[i]))), math.Log10(math.Max(s.ys[i], 1e-3))
			minX, maxX = math.Min(minX, x), math.Max(maxX, x)
			minY, maxY = math.Min(minY, y), math.Max(maxY, y)
		}
	}
	if math.IsInf(minX, 1) {
		return fmt.Errorf("--plot: nothing to draw")
	}
	if maxX == minX {
		maxX++
	}
	minY, maxY = math.Floor(minY), math.Ceil(maxY)
	if maxY == minY {
		maxY++
	}
	px := func(x float64) float64 { return L + (x-minX)/(maxX-minX)*(W-L-R) }
	py := func(y float64) float64 { return H - B - (y-minY)/(maxY-minY)*(H-T-B) }
	var b strings.Builder
	fmt.Fprintf(&b, `<svg xmlns="http://www.w3.org/2000/svg" width="%g" height="%g" font-family="sans-serif" font-size="12">`+"\n", W, H)
	fmt.Fprintf(&b, `<rect width="100%%" height="100%%" fill="white"/>`+"\n")
	fmt.Fprintf(&b, `<text x="%g" y="18" font-size="14">gompi-bench %s: %s against message size</text>`+"\n", L, cfg.mode, unit)
	for y := minY; y <= maxY; y++ {
		fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#ddd"/><text x="%g" y="%g" text-anchor="end">%g</text>`+"\n", L, py(y), W-R, py(y), L-6, py(y)+4, math.Pow(10, y))
	}
	for x := math.Ceil(minX); x <= maxX; x += 2 {
		fmt.Fprintf(&b, `<line x1="%g" y1="%g" x2="%g" y2="%g" stroke="#eee"/><text x="%g" y="%g" text-anchor="middle">%s</text>`+"\n", px(x), T, px(x), H-B, px(x), H-B+16, sizeLabel(int(math.Pow(2, x))))
	}
	fmt.Fprintf(&b, `<text x="%g" y="%g" text-anchor="middle">message size (bytes, log scale)</text>`+"\n", (L+W-R)/2, H-20)
	colors := []string{"#c0392b", "#2471a3"}
	for i, s := range all {
		var pts []string
		for j := range s.xs {
			pts = append(pts, fmt.Sprintf("%.1f,%.1f", px(math.Log2(float64(max(1, s.xs[j])))), py(math.Log10(math.Max(s.ys[j], 1e-3)))))
		}
		c := colors[i%len(colors)]
		fmt.Fprintf(&b, `<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>`+"\n", c, strings.Join(pts, " "))
		fmt.Fprintf(&b, `<rect x="%g" y="%g" width="12" height="3" fill="%s"/><text x="%g" y="%g">%s</text>`+"\n", W-R-140, T+10+float64(i)*16, c, W-R-124, T+14+float64(i)*16, s.label)
	}
	b.WriteString("</svg>\n")
	return os.WriteFile(cfg.plot, []byte(b.String()), 0o644)
}

func sizeLabel(n int) string {
	switch {
	case n >= 1<<20:
		return fmt.Sprintf("%dM", n>>20)
	case n >= 1<<10:
		return fmt.Sprintf("%dk", n>>10)
	}
	return strconv.Itoa(n)
}
