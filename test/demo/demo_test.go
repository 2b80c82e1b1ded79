package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestDemo runs make demo's program the way make demo-check does: up to the summary, then exit.
func TestDemo(t *testing.T) {
	var out bytes.Buffer
	rows, err := run(context.Background(), options{dir: t.TempDir(), exit: true, timeout: 2 * time.Minute}, &out)
	if err != nil {
		t.Fatalf("%v\n%s", err, out.String())
	}
	if len(rows) != 3 {
		t.Fatalf("%d Metal3Data reported:\n%s", len(rows), out.String())
	}
	for _, r := range rows {
		if len(r.Claims) != 3 || r.ClaimsByCAPM3 != 0 || r.Reconciles == 0 {
			t.Errorf("%+v", r)
		}
		for claim, addr := range r.Claims {
			if addr == "" || !strings.Contains(addr, "/") {
				t.Errorf("%s: %s has no address", r.Name, claim)
			}
		}
	}
	if !strings.Contains(out.String(), "CLAIMS AND ADDRESSES") {
		t.Errorf("no summary:\n%s", out.String())
	}
}
