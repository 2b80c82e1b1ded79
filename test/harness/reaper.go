package harness

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"
)

// reapMarker is set in the environment of every process a test program starts, directly or
// through envtest, which inherit it; a watcher outside the program kills them all once the
// program is gone, however it ended: a failed assertion, a panic, a -timeout or a SIGKILL.
const reapMarker = "IP_PREALLOCATOR_REAP"

// reapScript waits for the program ($1) to exit, then kills every process whose environment holds
// the marker ($2). A process whose environment cannot be read has already exited.
const reapScript = `while kill -0 "$1" 2>/dev/null; do sleep 1; done
for env in /proc/[0-9]*/environ; do
  if tr '\0' '\n' 2>/dev/null <"$env" | grep -qxF "$2"; then
    pid=${env#/proc/}
    kill -KILL "${pid%/environ}" 2>/dev/null
  fi
done`

var (
	programStart = time.Now()
	reaperOnce   sync.Once
)

// startReaper marks this program's children and starts the watcher and the watchdog, once; it
// runs before the first process is started.
func startReaper() {
	reaperOnce.Do(func() {
		marker := fmt.Sprintf("%s=%d-%d", reapMarker, os.Getpid(), programStart.UnixNano())
		var env []string
		for _, kv := range os.Environ() {
			if !strings.HasPrefix(kv, reapMarker+"=") {
				env = append(env, kv)
			}
		}
		watcher := exec.CommandContext(context.Background(), "sh", "-c", reapScript, "reaper", strconv.Itoa(os.Getpid()), marker)
		watcher.Env = env
		// Its own process group: an interrupt of the program must not end the watcher with it.
		watcher.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		if err := watcher.Start(); err != nil {
			fmt.Fprintf(os.Stderr, "harness: no reaper, processes may outlive this program: %v\n", err)
		} else {
			go func() { _ = watcher.Wait() }()
		}
		_, value, _ := strings.Cut(marker, "=")
		_ = os.Setenv(reapMarker, value)
		go watchdog()
	})
}

// watchdog ends a test program shortly before its -timeout would: the testing package would
// panic with a dump of every goroutine, which does not say which suite ran out of time or why.
// The reaper then stops what the suite started.
func watchdog() {
	timeoutFlag := flag.Lookup("test.timeout")
	if timeoutFlag == nil {
		return
	}
	for !flag.Parsed() {
		time.Sleep(time.Second)
	}
	getter, ok := timeoutFlag.Value.(flag.Getter)
	if !ok {
		return
	}
	timeout, _ := getter.Get().(time.Duration)
	if timeout <= 0 {
		return
	}
	// The testing package's clock starts after TestMain's set-up, later than programStart, so
	// this always fires first.
	margin := min(30*time.Second, timeout/2)
	time.Sleep(time.Until(programStart.Add(timeout - margin)))
	fmt.Fprintf(os.Stderr, "\nFAIL %s: still running %s after it started, %s before its -timeout of %s; "+
		"its processes are stopped. The suite's timeout in hack/test-suites.sh is two to five times what it "+
		"takes on an idle 2-core machine, so this one is slower or busier (load average %s).\n",
		suiteName(), time.Since(programStart).Round(time.Second), margin, timeout, loadAverage())
	os.Exit(1)
}

// suiteName is the test package's directory relative to the repository, where go test runs it.
func suiteName() string {
	dir, err := os.Getwd()
	if err != nil {
		return filepath.Base(os.Args[0])
	}
	if root, err := RepoRoot(); err == nil {
		if rel, err := filepath.Rel(root, dir); err == nil {
			return rel
		}
	}
	return dir
}

func loadAverage() string {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	fields := strings.Fields(string(data))
	return strings.Join(fields[:min(3, len(fields))], " ")
}
