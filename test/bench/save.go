package main

import (
	"encoding/json"
	"math"
	"os"
	"regexp"

	"gonum.org/v1/plot/vg/vgimg"
)

func saveImage(img *vgimg.Canvas, path string) error {
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := (vgimg.PngCanvas{Canvas: img}).WriteTo(f); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// encodeReport rounds each machine's times in the report to the millisecond, so that a page
// written after it reads what the file keeps, and writes the report as indented JSON with every
// array of numbers or plain words on one line: one to a line, the thousands of machines of a scale
// run would take megabytes.
func encodeReport(report *Report) ([]byte, error) {
	for i := range report.Runs {
		for _, times := range [][]float64{report.Runs[i].TimeToReady, report.Runs[i].BeforeData} {
			for j, t := range times {
				times[j] = math.Round(t*1000) / 1000
			}
		}
	}
	data, err := json.MarshalIndent(report, "", "  ")
	if err != nil {
		return nil, err
	}
	return scalarArray.ReplaceAllFunc(data, func(array []byte) []byte { return whitespace.ReplaceAll(array, nil) }), nil
}

var (
	// scalarArray is an indented array of numbers, or of strings without spaces, quotes or escapes.
	scalarArray = regexp.MustCompile(`\[\s+(?:-?[0-9][0-9.eE+-]*|"[^"\\\s]*")(?:,\s+(?:-?[0-9][0-9.eE+-]*|"[^"\\\s]*"))*\s+\]`)
	whitespace  = regexp.MustCompile(`\s+`)
)
