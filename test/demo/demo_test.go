package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"
)

// TestDemo runs make demo's program up to its table and checks what the table claims: both modes
// ran, stock CAPM3 created every claim and the webhook none in stock, the webhook created every
// claim with it but those it said, in a Warning Event, that CAPM3 created first, CAPM3 worked or
// waited in no more reconciles with the webhook than without, and every
// Metal3Data is Ready with an address from each of its three pools.
func TestDemo(t *testing.T) {
	var out bytes.Buffer
	rows, err := run(context.Background(), options{dir: t.TempDir(), exit: true, timeout: 2 * time.Minute}, &out)
	t.Log("\n" + out.String())
	if err != nil {
		t.Fatal(err)
	}
	const pools = 3
	byMode := map[string]int{}
	for _, r := range rows {
		byMode[r.Mode]++
		wantCAPM3, wantWebhook := pools, 0
		if r.Mode == modePreallocated {
			// The webhook answers once its claim creates are sent, not stored; a CAPM3 reconcile
			// that comes first creates a claim itself, and the webhook says so in a Warning Event.
			wantCAPM3, wantWebhook = r.CAPM3CreatedWarned, pools-r.CAPM3CreatedWarned
		}
		if r.ClaimsByCAPM3 != wantCAPM3 || r.ClaimsByWebhook != wantWebhook {
			t.Errorf("%s %s: claims created by CAPM3 %d, by the webhook %d; want %d and %d",
				r.Mode, r.Data, r.ClaimsByCAPM3, r.ClaimsByWebhook, wantCAPM3, wantWebhook)
		}
		if r.ReadyAfter <= 0 || r.Reconciles.Work == 0 {
			t.Errorf("%s %s: ready after %v, reconciles %s", r.Mode, r.Data, r.ReadyAfter, r.Reconciles.History)
		}
		if len(r.Addresses) != pools {
			t.Errorf("%s %s: addresses %v, want one from each of %d pools", r.Mode, r.Data, r.Addresses, pools)
		}
		for pool, addr := range r.Addresses {
			if !strings.Contains(addr, "/") {
				t.Errorf("%s %s: pool %s gave %q", r.Mode, r.Data, pool, addr)
			}
		}
	}
	if byMode[modeStock] != 3 || byMode[modePreallocated] != 3 {
		t.Errorf("Metal3Data by mode: %v, want 3 stock and 3 preallocated", byMode)
	}
	stock, pre := summarize(rows, modeStock), summarize(rows, modePreallocated)
	if 2*pre.claimsByCAPM3 > pre.claims {
		t.Errorf("CAPM3 created %d of %d claims with the webhook", pre.claimsByCAPM3, pre.claims)
	}
	// Reconciles that worked or waited; the no-ops, woken by CAPM3's own status patch from a
	// cache that lags, come and go in both modes.
	busy := map[string]int{}
	for _, r := range rows {
		busy[r.Mode] += r.Reconciles.Work + r.Reconciles.Requeue
	}
	if busy[modePreallocated] > busy[modeStock] {
		t.Errorf("CAPM3 worked or waited in %d reconciles with the webhook, %d without (all reconciles: %d and %d)",
			busy[modePreallocated], busy[modeStock], pre.reconciles, stock.reconciles)
	}
	if !strings.Contains(out.String(), "With the webhook: ") {
		t.Error("no comparison printed")
	}
}
