package main

import (
	"os"
	"path/filepath"
	"testing"
)

func TestProcStat(t *testing.T) {
	path := filepath.Join(t.TempDir(), "stat")
	// A command name with a space and a parenthesis, as proc(5) allows.
	line := "4242 (kube (api) s) S 17 4242 4242 0 -1 4194560 100 0 0 0 250 50 7 3 20 0 12 0 1 2 3\n"
	if err := os.WriteFile(path, []byte(line), 0o600); err != nil {
		t.Fatal(err)
	}
	st, err := procStat(path)
	if err != nil {
		t.Fatal(err)
	}
	want := procStatus{comm: "kube (api) s", ppid: 17, cpu: 3.0, childrenCPU: 0.1}
	if st != want {
		t.Fatalf("procStat = %+v, want %+v", st, want)
	}
}

func TestReadCPUCountsThisProcess(t *testing.T) {
	before, err := readCPU()
	if err != nil {
		t.Fatal(err)
	}
	x := 0
	for i := range 200_000_000 {
		x += i % 7
	}
	after, err := readCPU()
	if err != nil {
		t.Fatal(err)
	}
	if used := after.minus(before)["in-process"]; used <= 0 {
		t.Fatalf("a busy loop (%d) used %.2fs of CPU in-process", x, used)
	}
}
