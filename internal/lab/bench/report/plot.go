package report

import (
	"fmt"
	"image/color"
	"math"
	"path/filepath"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"

	"github.com/mpdetour/mpdetour/internal/lab/bench/scenario"
)

// WritePlots draws, for every configuration with data, a box plot of the
// goodput of each procedure (with the original mean as a red cross where
// known), as plot-CONFIG.png and .svg; and, when two or more
// configurations have MPTCP detour cells with all their single paths
// measured, aggregation.png/.svg with the sum ratio per configuration.
// It returns the PNG name per configuration.
func (d *Data) WritePlots(dir string) (map[string]string, error) {
	out := map[string]string{}
	if d.timesOnly() {
		return out, nil // no goodput to plot
	}
	for _, cfg := range d.Scenario.Configurations {
		p, ok, err := d.boxPlot(cfg.Name, cfg.Label)
		if err != nil {
			return nil, fmt.Errorf("plot %s: %w", cfg.Name, err)
		}
		if !ok {
			continue
		}
		base := "plot-" + cfg.Name
		w := vg.Length(1.3*float64(len(d.cellsOf(cfg.Name)))+2) * vg.Inch
		for _, ext := range []string{".png", ".svg"} {
			if err := p.Save(w, 4*vg.Inch, filepath.Join(dir, base+ext)); err != nil {
				return nil, fmt.Errorf("plot %s: %w", cfg.Name, err)
			}
		}
		out[cfg.Name] = base + ".png"
	}
	if p, ok, err := d.aggregationPlot(); err != nil {
		return nil, err
	} else if ok {
		for _, ext := range []string{".png", ".svg"} {
			if err := p.Save(6*vg.Inch, 4*vg.Inch, filepath.Join(dir, "aggregation"+ext)); err != nil {
				return nil, fmt.Errorf("aggregation plot: %w", err)
			}
		}
		out[""] = "aggregation.png"
	}
	return out, nil
}

func (d *Data) cellsOf(cfg string) []*Cell {
	var cs []*Cell
	for _, c := range d.Cells {
		if c.Configuration == cfg {
			cs = append(cs, c)
		}
	}
	return cs
}

func (d *Data) boxPlot(cfg, label string) (*plot.Plot, bool, error) {
	cells := d.cellsOf(cfg)
	hasData := false
	for _, c := range cells {
		hasData = hasData || c.Goodput.N > 0
	}
	if !hasData {
		return nil, false, nil
	}
	p := plot.New()
	p.Title.Text = fmt.Sprintf("%s: %s", d.Scenario.Name, label)
	p.Y.Label.Text = "goodput (Mbit/s)"
	p.Y.Min = 0
	var names []string
	var ref plotter.XYs
	for i, c := range cells {
		name := c.Label()
		if c.Goodput.N == 0 {
			name += "\n(no data)"
		}
		names = append(names, name)
		if c.Goodput.N > 0 {
			b, err := plotter.NewBoxPlot(vg.Points(24), float64(i), plotter.Values(c.Values))
			if err != nil {
				return nil, false, err
			}
			p.Add(b)
		}
		if r := d.Scenario.Reference; r != nil {
			if v, ok := r.Results[cfg][c.ID]; ok {
				ref = append(ref, plotter.XY{X: float64(i), Y: v[0]})
			}
		}
	}
	if len(ref) > 0 {
		s, err := plotter.NewScatter(ref)
		if err != nil {
			return nil, false, err
		}
		s.GlyphStyle.Shape = draw.CrossGlyph{}
		s.GlyphStyle.Color = color.RGBA{R: 200, A: 255}
		s.GlyphStyle.Radius = vg.Points(5)
		p.Add(s)
		p.Legend.Add("original mean", s)
		p.Legend.Top = true
	}
	p.NominalX(names...)
	// Every procedure gets its slot, also those without data, and the
	// tallest box keeps some headroom below the title.
	p.X.Min, p.X.Max = -0.5, float64(len(cells))-0.5
	top := 0.0
	for _, c := range cells {
		top = math.Max(top, c.Goodput.Max)
	}
	for _, xy := range ref {
		top = math.Max(top, xy.Y)
	}
	p.Y.Max = 1.12 * top
	p.Add(plotter.NewGrid())
	return p, true, nil
}

func (d *Data) aggregationPlot() (*plot.Plot, bool, error) {
	series := map[string]plotter.XYs{}
	var order []string
	for i, cfg := range d.Scenario.Configurations {
		for _, c := range d.cellsOf(cfg.Name) {
			if scenario.SinglePath(c.Procedure) == "" {
				continue
			}
			r := d.Ratios(c)
			if math.IsNaN(r.Sum) {
				continue
			}
			if _, ok := series[c.Procedure]; !ok {
				order = append(order, c.Procedure)
			}
			series[c.Procedure] = append(series[c.Procedure], plotter.XY{X: float64(i), Y: r.Sum})
		}
	}
	n := 0
	for _, s := range series {
		n = max(n, len(s))
	}
	if n < 2 {
		return nil, false, nil
	}
	p := plot.New()
	p.Title.Text = d.Scenario.Name + ": aggregation efficiency"
	p.Y.Label.Text = "MPTCP / sum of single paths"
	p.Y.Min, p.Y.Max = 0, 1.1
	var names []string
	for _, cfg := range d.Scenario.Configurations {
		names = append(names, cfg.Label)
	}
	p.NominalX(names...)
	for i, proc := range order {
		l, pts, err := plotter.NewLinePoints(series[proc])
		if err != nil {
			return nil, false, err
		}
		c := []color.Color{color.RGBA{B: 200, A: 255}, color.RGBA{G: 140, A: 255}}[i%2]
		l.Color, pts.Color = c, c
		p.Add(l, pts)
		p.Legend.Add(scenario.Label(proc), l, pts)
	}
	p.Add(plotter.NewGrid())
	return p, true, nil
}
