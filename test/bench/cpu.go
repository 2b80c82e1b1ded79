package main

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
)

// userHZ is the unit of /proc's CPU times on Linux (USER_HZ, 100 on every architecture Go's
// Linux ports run on).
const userHZ = 100

// cpuProcesses names the benchmark's child processes by their /proc comm (the first 15 bytes of
// the executable's name); CAPM3's controllers, the Metal3 IPAM and the benchmark's own watches
// run in this process, "in-process".
var cpuProcesses = map[string]string{
	"kube-apiserver":  "kube-apiserver",
	"etcd":            "etcd",
	"webhook":         "webhook",
	"cluster-api-ipa": "in-cluster-ipam",
}

// cpuComponents orders the columns of the CPU table.
var cpuComponents = []string{"kube-apiserver", "etcd", "webhook", "in-process", "in-cluster-ipam"}

// cpuClock is the CPU time, in seconds, each component has used since it started.
type cpuClock map[string]float64

// readCPU reads the CPU time of this process and of its child processes. On 2 shared cores the
// time a serial loop of requests takes follows how much CPU everything else on the machine
// uses: the clocks tell which process used it.
func readCPU() (cpuClock, error) {
	self, err := procStat("/proc/self/stat")
	if err != nil {
		return nil, err
	}
	// /proc reports child processes that exited and were waited for only as a sum. During a run
	// the only ones are webhook replicas killed in the leader-loss scenario, so the difference of
	// two clocks counts it as the webhook's.
	clock := cpuClock{"in-process": self.cpu, "webhook": self.childrenCPU}
	entries, err := filepath.Glob("/proc/[0-9]*/stat")
	if err != nil {
		return nil, err
	}
	pid := os.Getpid()
	for _, path := range entries {
		st, err := procStat(path)
		if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
			continue // exited since the glob
		}
		if err != nil {
			return nil, err
		}
		if st.ppid != pid {
			continue
		}
		if name, ok := cpuProcesses[st.comm]; ok {
			clock[name] += st.cpu
		}
	}
	return clock, nil
}

type procStatus struct {
	comm             string
	ppid             int
	cpu, childrenCPU float64
}

// procStat parses proc(5)'s stat line: "pid (comm) state ppid ... utime stime cutime cstime".
func procStat(path string) (procStatus, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return procStatus{}, err
	}
	line := string(data)
	open, closing := strings.IndexByte(line, '('), strings.LastIndexByte(line, ')')
	if open < 0 || closing < open {
		return procStatus{}, fmt.Errorf("%s: no command name", path)
	}
	fields := strings.Fields(line[closing+1:])
	// fields[0] is the state (stat field 3); utime..cstime are fields 14-17.
	if len(fields) < 15 {
		return procStatus{}, fmt.Errorf("%s: %d fields", path, len(fields))
	}
	var ticks [4]float64
	for i := range ticks {
		v, err := strconv.ParseFloat(fields[11+i], 64)
		if err != nil {
			return procStatus{}, fmt.Errorf("%s: %w", path, err)
		}
		ticks[i] = v / userHZ
	}
	ppid, err := strconv.Atoi(fields[1])
	if err != nil {
		return procStatus{}, fmt.Errorf("%s: %w", path, err)
	}
	return procStatus{comm: line[open+1 : closing], ppid: ppid, cpu: ticks[0] + ticks[1], childrenCPU: ticks[2] + ticks[3]}, nil
}

// minus is the CPU each component used since before.
func (c cpuClock) minus(before cpuClock) cpuClock {
	d := cpuClock{}
	for k, v := range c {
		d[k] = v - before[k]
	}
	return d
}
