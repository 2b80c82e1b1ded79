package main

import (
	"fmt"
	"image/color"
	"slices"
	"sort"

	"gonum.org/v1/plot"
	"gonum.org/v1/plot/plotter"
	"gonum.org/v1/plot/vg"
	"gonum.org/v1/plot/vg/draw"
	"gonum.org/v1/plot/vg/vgimg"
)

var modeColors = map[string]color.Color{
	modeStock:        color.RGBA{R: 200, G: 60, B: 40, A: 255},
	modePreallocated: color.RGBA{R: 30, G: 90, B: 200, A: 255},
	modeNoOp:         color.RGBA{R: 90, G: 160, B: 60, A: 255},
}

// plotCDF draws, for each scenario, the cumulative distribution of time to Ready of every run.
func plotCDF(r *Report, path string) error {
	var panels [][]*plot.Plot
	var row []*plot.Plot
	for _, q := range r.Comparisons {
		p := plot.New()
		p.Title.Text = q.Setting + " / " + q.Scenario
		p.X.Label.Text = "seconds from the Metal3DataClaim's create to Ready"
		p.Y.Label.Text = "fraction of Metal3Data"
		p.Y.Min, p.Y.Max = 0, 1
		for _, run := range r.Runs {
			if run.Setting != q.Setting || run.Scenario != q.Scenario {
				continue
			}
			sorted := slices.Clone(run.TimeToReady)
			sort.Float64s(sorted)
			pts := make(plotter.XYs, len(sorted))
			for i, v := range sorted {
				pts[i] = plotter.XY{X: v, Y: float64(i+1) / float64(len(sorted))}
			}
			line, err := plotter.NewLine(pts)
			if err != nil {
				return err
			}
			line.Width = vg.Points(1.5)
			line.Color = modeColors[run.Mode]
			if run.Repeat > 0 {
				line.Dashes = []vg.Length{vg.Points(4), vg.Points(2)}
			}
			p.Add(line)
			p.Legend.Add(fmt.Sprintf("%s #%d (p50 %.1fs)", run.Mode, run.Repeat+1, run.Ready.P50), line)
		}
		p.Legend.Top, p.Legend.Left = false, false
		p.Legend.YOffs = vg.Points(20)
		row = append(row, p)
		if len(row) == 2 {
			panels, row = append(panels, row), nil
		}
	}
	if len(row) > 0 {
		row = append(row, nil)
		panels = append(panels, row)
	}
	const w, h = 6 * vg.Inch, 3.5 * vg.Inch
	img := vgimg.New(2*w, vg.Length(len(panels))*h)
	dc := draw.New(img)
	tiles := draw.Tiles{Rows: len(panels), Cols: 2, PadX: vg.Millimeter, PadY: vg.Millimeter}
	canvases := plot.Align(panels, tiles, dc)
	for i := range panels {
		for j, p := range panels[i] {
			if p != nil {
				p.Draw(canvases[i][j])
			}
		}
	}
	return saveImage(img, path)
}
