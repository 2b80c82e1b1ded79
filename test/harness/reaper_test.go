package harness

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"
)

// reaperChild, when set, makes TestReaperStopsWhatASuiteLeaves the suite that dies: it starts a
// process and then panics, or hangs until its -timeout.
const reaperChild = "HARNESS_REAPER_CHILD"

// TestReaperStopsWhatASuiteLeaves runs this test program again as a suite that starts a process
// and then panics, or runs into its -timeout, and checks that the process does not outlive it and
// that a timeout says which suite and why.
func TestReaperStopsWhatASuiteLeaves(t *testing.T) {
	if how := os.Getenv(reaperChild); how != "" {
		proc, err := StartProcess(context.Background(), filepath.Join(t.TempDir(), "sleep.log"), "sleep", nil, "600")
		if err != nil {
			t.Fatal(err)
		}
		fmt.Printf("pid %d\n", proc.Pid())
		if how == "panic" {
			panic("the suite panics with its process running")
		}
		time.Sleep(time.Hour)
	}
	for _, tc := range []struct {
		how, timeout, wantOutput string
	}{
		{how: "panic", timeout: "1m", wantOutput: "the suite panics"},
		{how: "timeout", timeout: "8s", wantOutput: "FAIL test/harness: still running"},
	} {
		t.Run(tc.how, func(t *testing.T) {
			cmd := exec.CommandContext(context.Background(), os.Args[0], "-test.run=^TestReaperStopsWhatASuiteLeaves$", "-test.timeout="+tc.timeout)
			cmd.Env = append(os.Environ(), reaperChild+"="+tc.how)
			var out bytes.Buffer
			cmd.Stdout, cmd.Stderr = &out, &out
			if err := cmd.Run(); err == nil {
				t.Fatalf("the dying suite passed:\n%s", out.String())
			}
			if !strings.Contains(out.String(), tc.wantOutput) {
				t.Errorf("its output does not say %q:\n%s", tc.wantOutput, out.String())
			}
			if tc.how == "timeout" && strings.Contains(out.String(), "goroutine ") {
				t.Errorf("its output is a goroutine dump:\n%s", out.String())
			}
			pid := childPid(t, out.String())
			deadline := time.Now().Add(10 * time.Second)
			for alive(pid) {
				if time.Now().After(deadline) {
					t.Fatalf("process %d outlived its suite by 10s", pid)
				}
				time.Sleep(100 * time.Millisecond)
			}
		})
	}
}

func childPid(t *testing.T, out string) int {
	t.Helper()
	scanner := bufio.NewScanner(strings.NewReader(out))
	for scanner.Scan() {
		if rest, ok := strings.CutPrefix(scanner.Text(), "pid "); ok {
			pid, err := strconv.Atoi(rest)
			if err != nil {
				t.Fatal(err)
			}
			return pid
		}
	}
	t.Fatalf("the suite printed no pid:\n%s", out)
	return 0
}

// alive tells whether pid runs: a killed process whose new parent has not reaped it yet is a
// zombie, state Z.
func alive(pid int) bool {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return false
	}
	_, rest, _ := strings.Cut(string(stat), ") ")
	return !strings.HasPrefix(rest, "Z")
}
