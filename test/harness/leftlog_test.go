package harness

import (
	"os"
	"path/filepath"
	"testing"
)

func TestClaimsLeftToCAPM3InLogs(t *testing.T) {
	dir := t.TempDir()
	log := `I1130 15:38:09.443307   17304 admissions.go:144] "IP claim left to CAPM3" Metal3Data="ns-a/masters-86" admission="t-86" IPClaim="ns-a/masters-86-baremetal" outcome="foreign" error="IPClaim ns-a/masters-86-baremetal exists"
I1130 15:38:09.443307   17304 admissions.go:144] "IP claim left to CAPM3" Metal3Data="ns-b/workers-1" admission="t-1" IPAddressClaim="ns-b/workers-1-external" outcome="failed" error="x"
I1130 15:38:09.448794   17304 handover.go:1] "Preallocated IP claim" Metal3Data="ns-a/masters-87" IPClaim="ns-a/masters-87-baremetal"
`
	if err := os.WriteFile(filepath.Join(dir, "replica-0.log"), []byte(log), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := ClaimsLeftToCAPM3InLogs(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || !got["t-86/ns-a/IPClaim/masters-86-baremetal"] || !got["t-1/ns-b/IPAddressClaim/workers-1-external"] {
		t.Errorf("left to CAPM3: %v", got)
	}
}
