package harness

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// LeaderElectionID is the lease the webhook replicas compete for (cmd/webhook).
const LeaderElectionID = "ip-preallocator.metal3.io"

// WebhookKubeconfig returns the kubeconfig of config/rbac's service account, creating the user
// and the file on first use. The webhook processes authenticate with it, so a missing RBAC rule
// fails the tests.
func (cp *ControlPlane) WebhookKubeconfig() (string, error) {
	if cp.webhookKubeconfig == "" {
		path, err := cp.ServiceAccountKubeconfig(cp.ServiceAccount())
		if err != nil {
			return "", err
		}
		cp.webhookKubeconfig = path
	}
	return cp.webhookKubeconfig, nil
}

// Kill sends SIGKILL and waits until the process has exited: nothing of it runs afterwards, no
// deferred clean-up, no lease release.
func (p *Process) Kill() {
	if !p.Running() {
		return
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Done is closed when the process has exited.
func (p *Process) Done() <-chan struct{} { return p.done }

// Replica is one webhook process of Replicas, with its own ports and log.
type Replica struct {
	Index int
	// WebhookAddr is where its webhook server listens; the load balancer forwards to it.
	WebhookAddr string
	HealthAddr  string
	MetricsAddr string
	LogPath     string

	proc       *Process
	kubeconfig string
	// down: stopped or killed on purpose, so Supervise leaves it alone.
	down bool
	// restarting: Supervise saw it exit on its own and will start it again.
	restarting bool
	starts     int
}

// Replicas are webhook processes run as a Deployment runs them: each with --leader-elect, all
// serving admissions behind one load balancer on the address the webhook configurations name.
type Replicas struct {
	cp   *ControlPlane
	bin  string
	args []string
	lb   *LoadBalancer

	mu       sync.Mutex
	replicas []*Replica
	crashes  int
	kills    int
	restarts int
	stopped  bool
	// killedAt is when each SIGKILL of a running replica was sent.
	killedAt []time.Time
}

// StartReplicas runs n webhook processes with the flags StartWebhook gives the single webhook
// (and Options.WebhookArgs, then extraArgs), each on its own ports with its own log
// (replica-<i>.log), behind a LoadBalancer listening where the webhook configurations point, and
// waits until every replica is ready.
func (cp *ControlPlane) StartReplicas(ctx context.Context, n int, extraArgs ...string) (_ *Replicas, err error) {
	kubeconfig, err := cp.WebhookKubeconfig()
	if err != nil {
		return nil, err
	}
	bin, err := WebhookBinary(cp.Root)
	if err != nil {
		return nil, err
	}
	rs := &Replicas{cp: cp, bin: bin, args: append(append([]string{}, cp.opts.WebhookArgs...), extraArgs...)}
	if !cp.opts.NoCAPM3 {
		cp.bmhNameBased = bmhNameBasedIn(rs.args)
		if err := cp.DeclareCAPM3(ctx, CAPM3Image, cp.bmhNameBased, cp.capm3Args...); err != nil {
			return nil, err
		}
	}
	defer func() {
		if err != nil {
			rs.Stop()
		}
	}()
	opts := cp.Env.WebhookInstallOptions
	var backends []Backend
	for i := range n {
		r := &Replica{Index: i, kubeconfig: kubeconfig, LogPath: filepath.Join(cp.Dir, fmt.Sprintf("replica-%d.log", i))}
		for _, addr := range []*string{&r.WebhookAddr, &r.HealthAddr, &r.MetricsAddr} {
			if *addr, err = FreeAddr(); err != nil {
				return nil, err
			}
		}
		rs.replicas = append(rs.replicas, r)
		backends = append(backends, Backend{Addr: r.WebhookAddr, ReadyURL: "http://" + r.HealthAddr + "/readyz"})
	}
	rs.lb, err = StartLoadBalancer(net.JoinHostPort(opts.LocalServingHost, strconv.Itoa(opts.LocalServingPort)), backends)
	if err != nil {
		return nil, err
	}
	for i := range rs.replicas {
		if err := rs.Restart(i); err != nil {
			return nil, err
		}
	}
	for i := range rs.replicas {
		if err := rs.WaitReady(ctx, i, 60*time.Second); err != nil {
			return nil, err
		}
	}
	return rs, nil
}

// Len is the number of replicas.
func (rs *Replicas) Len() int { return len(rs.replicas) }

// Replica returns replica i.
func (rs *Replicas) Replica(i int) *Replica { return rs.replicas[i] }

// LoadBalancer is the load balancer in front of the replicas.
func (rs *Replicas) LoadBalancer() *LoadBalancer { return rs.lb }

// Restart starts replica i again (it must not be running), with its current kubeconfig. It does
// not wait for readiness: the load balancer sends it admissions once /readyz answers, as a
// Service does once the readiness probe passes.
func (rs *Replicas) Restart(i int) error {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return rs.startLocked(i)
}

func (rs *Replicas) startLocked(i int) error {
	r := rs.replicas[i]
	if r.proc != nil && r.proc.Running() {
		return fmt.Errorf("replica %d is running", i)
	}
	opts := rs.cp.Env.WebhookInstallOptions
	host, port, _ := net.SplitHostPort(r.WebhookAddr)
	args := append([]string{
		"--webhook-host=" + host,
		"--webhook-port=" + port,
		"--webhook-cert-dir=" + opts.LocalServingCertDir,
		"--health-addr=" + r.HealthAddr,
		"--diagnostics-address=" + r.MetricsAddr,
		"--insecure-diagnostics",
		"--leader-elect",
		"--leader-election-namespace=" + rs.cp.serviceAccountNamespace(),
	}, rs.args...)
	r.starts++
	if r.starts > 1 {
		rs.restarts++
	}
	// A line between the runs of one replica in its log.
	if f, err := os.OpenFile(r.LogPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644); err == nil {
		fmt.Fprintf(f, "===== harness: start %d of replica %d at %s, kubeconfig %s\n", r.starts, i, time.Now().Format(time.RFC3339Nano), r.kubeconfig)
		f.Close()
	}
	proc, err := StartProcess(context.Background(), r.LogPath, rs.bin, append(rs.cp.ManagerEnv(),
		"KUBECONFIG="+r.kubeconfig, "POD_NAMESPACE="+rs.cp.serviceAccountNamespace(), fmt.Sprintf("POD_NAME=%s-%d", WebhookPod, r.Index),
	), args...)
	if err != nil {
		return err
	}
	r.proc, r.down = proc, false
	return nil
}

// Kill sends SIGKILL to replica i and waits until it has exited. It stays down until Restart.
func (rs *Replicas) Kill(i int) {
	rs.mu.Lock()
	r := rs.replicas[i]
	r.down = true
	proc := r.proc
	if proc != nil && proc.Running() {
		rs.kills++
		rs.killedAt = append(rs.killedAt, time.Now())
	}
	rs.mu.Unlock()
	if proc != nil {
		proc.Kill()
	}
}

// KilledBetween tells whether a running replica was SIGKILLed from one moment to another: a
// replica's work in flight then, such as the claim creates of an admission it answered, died
// with it.
func (rs *Replicas) KilledBetween(from, to time.Time) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return slices.ContainsFunc(rs.killedAt, func(t time.Time) bool { return !t.Before(from) && !t.After(to) })
}

// StopReplica ends replica i gracefully (SIGTERM: it releases the lease). It stays down until
// Restart.
func (rs *Replicas) StopReplica(i int) {
	rs.mu.Lock()
	r := rs.replicas[i]
	r.down = true
	proc := r.proc
	rs.mu.Unlock()
	if proc != nil {
		proc.Stop()
	}
}

// Running tells whether replica i's process is alive.
func (rs *Replicas) Running(i int) bool {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	r := rs.replicas[i]
	return r.proc != nil && r.proc.Running()
}

// Ready tells whether replica i answers its readiness probe.
func (rs *Replicas) Ready(i int) bool {
	return rs.Running(i) && healthy(probeClient, "http://"+rs.replicas[i].HealthAddr+"/readyz") == nil
}

// WaitReady waits until replica i is ready, at most timeout.
func (rs *Replicas) WaitReady(ctx context.Context, i int, timeout time.Duration) error {
	r := rs.replicas[i]
	return waitFor(ctx, timeout, func() error {
		if !rs.Running(i) {
			return fmt.Errorf("replica %d is not running; see %s", i, r.LogPath)
		}
		return healthy(probeClient, "http://"+r.HealthAddr+"/readyz")
	})
}

// SetKubeconfig makes replica i use another kubeconfig (for example one through a FaultProxy)
// from its next start on.
func (rs *Replicas) SetKubeconfig(i int, path string) {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	rs.replicas[i].kubeconfig = path
}

// DefaultKubeconfig is the service account's kubeconfig every replica starts with.
func (rs *Replicas) DefaultKubeconfig() string { return rs.cp.webhookKubeconfig }

// Leader returns the replica whose controllers run: the one reporting
// leader_election_master_status 1 for the webhook's lease. ok is false when none does.
func (rs *Replicas) Leader() (int, bool) {
	for i := range rs.replicas {
		if !rs.Running(i) {
			continue
		}
		metrics, err := rs.Metrics(i)
		if err != nil {
			continue
		}
		if leading(metrics) {
			return i, true
		}
	}
	return -1, false
}

func leading(metrics string) bool {
	scanner := bufio.NewScanner(strings.NewReader(metrics))
	scanner.Buffer(make([]byte, 1<<20), 1<<24)
	for scanner.Scan() {
		line := scanner.Text()
		if strings.HasPrefix(line, "leader_election_master_status{") && strings.Contains(line, `name="`+LeaderElectionID+`"`) {
			return strings.HasSuffix(line, " 1")
		}
	}
	return false
}

// Metrics returns replica i's Prometheus metrics text.
func (rs *Replicas) Metrics(i int) (string, error) {
	req, err := http.NewRequestWithContext(context.Background(), http.MethodGet, "http://"+rs.replicas[i].MetricsAddr+"/metrics", http.NoBody)
	if err != nil {
		return "", err
	}
	resp, err := probeClient.Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	return string(body), err
}

// Supervise restarts, after delay, a replica whose process exited while nobody had killed or
// stopped it (a crash, or an exit on lost leadership), as the kubelet restarts a container, until
// ctx ends. Crashes counts them.
func (rs *Replicas) Supervise(ctx context.Context, delay time.Duration) {
	go wait.UntilWithContext(ctx, func(ctx context.Context) {
		rs.mu.Lock()
		defer rs.mu.Unlock()
		for i, r := range rs.replicas {
			if rs.stopped || r.down || r.restarting || r.proc == nil || r.proc.Running() {
				continue
			}
			rs.crashes++
			r.restarting = true
			go func() {
				select {
				case <-ctx.Done():
				case <-time.After(delay):
				}
				rs.mu.Lock()
				defer rs.mu.Unlock()
				r.restarting = false
				if ctx.Err() == nil && !rs.stopped && !r.down && !r.proc.Running() {
					_ = rs.startLocked(i)
				}
			}()
		}
	}, 100*time.Millisecond)
}

// ReplicaCounts are the lifecycle events of the replicas since they started.
type ReplicaCounts struct {
	// Kills: SIGKILLs sent to a running replica. Restarts: starts after the first. Crashes:
	// exits nobody caused (restarted by Supervise).
	Kills, Restarts, Crashes int
}

// Counts returns the lifecycle events so far.
func (rs *Replicas) Counts() ReplicaCounts {
	rs.mu.Lock()
	defer rs.mu.Unlock()
	return ReplicaCounts{Kills: rs.kills, Restarts: rs.restarts, Crashes: rs.crashes}
}

// Stop ends every replica gracefully and the load balancer.
func (rs *Replicas) Stop() {
	rs.mu.Lock()
	rs.stopped = true
	var procs []*Process
	for _, r := range rs.replicas {
		r.down = true
		if r.proc != nil {
			procs = append(procs, r.proc)
		}
	}
	rs.mu.Unlock()
	var wg sync.WaitGroup
	for _, p := range procs {
		wg.Go(p.Stop)
	}
	wg.Wait()
	if rs.lb != nil {
		rs.lb.Close()
	}
}

// probeClient asks health and metrics endpoints of local processes; a hung process must not
// hang the caller.
var probeClient = newProbeClient(2 * time.Second)

func newProbeClient(timeout time.Duration) *http.Client {
	return &http.Client{Timeout: timeout, Transport: &http.Transport{DisableKeepAlives: true}}
}
