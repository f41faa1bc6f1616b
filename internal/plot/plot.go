// Package plot draws the line charts and histograms peer writes at the end
// of a run, as PNG files, with gonum/plot.
package plot

import (
	"fmt"
	"image/color"
	"math"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
)

// Series is one named line.
type Series struct {
	Name string
	X, Y []float64
}

var palette = []color.Color{
	color.RGBA{31, 119, 180, 255}, color.RGBA{255, 127, 14, 255}, color.RGBA{44, 160, 44, 255},
	color.RGBA{214, 39, 40, 255}, color.RGBA{148, 103, 189, 255}, color.RGBA{140, 86, 75, 255},
	color.RGBA{227, 119, 194, 255}, color.RGBA{127, 127, 127, 255},
}

// Lines writes a line chart of the series to path (PNG, 6×4 inches).
func Lines(path, title, xlabel, ylabel string, series []Series) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.Y.Label.Text = ylabel
	p.Add(plotter.NewGrid())
	for i, s := range series {
		if len(s.X) != len(s.Y) {
			return fmt.Errorf("plot: series %q has %d x and %d y values", s.Name, len(s.X), len(s.Y))
		}
		if len(s.X) == 0 {
			continue
		}
		pts := make(plotter.XYs, len(s.X))
		for j := range s.X {
			pts[j].X, pts[j].Y = s.X[j], s.Y[j]
		}
		l, err := plotter.NewLine(pts)
		if err != nil {
			return fmt.Errorf("plot: series %q: %w", s.Name, err)
		}
		l.Color = palette[i%len(palette)]
		if k := i / len(palette); k > 0 { // past the palette: dashes tell the series apart
			l.Dashes = []vg.Length{vg.Points(float64(2 + 2*k)), vg.Points(2)}
		}
		l.Width = vg.Points(1.5)
		p.Add(l)
		if s.Name != "" {
			p.Legend.Add(s.Name, l)
		}
	}
	p.Legend.Top = !highOnRight(series)
	return p.Save(6*vg.Inch, 4*vg.Inch, path)
}

// highOnRight reports whether the series' values on the right 40% of the
// x range lie mostly in the upper half of the y range (rising accuracy
// curves), where the legend, drawn on the right, would hide them.
func highOnRight(series []Series) bool {
	xmin, xmax, ymin, ymax := math.Inf(1), math.Inf(-1), math.Inf(1), math.Inf(-1)
	for _, s := range series {
		for j := range s.X {
			xmin, xmax = min(xmin, s.X[j]), max(xmax, s.X[j])
			ymin, ymax = min(ymin, s.Y[j]), max(ymax, s.Y[j])
		}
	}
	high, low := 0, 0
	for _, s := range series {
		for j := range s.X {
			if s.X[j] < xmin+0.6*(xmax-xmin) {
				continue
			}
			if s.Y[j] > (ymin+ymax)/2 {
				high++
			} else {
				low++
			}
		}
	}
	return high > low
}

// Histogram writes a bar chart of counts per integer value (e.g. the
// staleness τ of merged updates) to path.
func Histogram(path, title, xlabel string, counts map[int]int) error {
	p := plot.New()
	p.Title.Text = title
	p.X.Label.Text = xlabel
	p.Y.Label.Text = "count"
	keys := make([]int, 0, len(counts))
	for k := range counts {
		keys = append(keys, k)
	}
	sort.Ints(keys)
	if len(keys) == 0 {
		keys = []int{0}
	}
	vals := make(plotter.Values, keys[len(keys)-1]-keys[0]+1)
	for _, k := range keys {
		vals[k-keys[0]] = float64(counts[k])
	}
	bars, err := plotter.NewBarChart(vals, vg.Points(8))
	if err != nil {
		return err
	}
	bars.Color = palette[0]
	bars.XMin = float64(keys[0])
	p.Add(bars)
	return p.Save(6*vg.Inch, 4*vg.Inch, path)
}
