package harness

import (
	"context"
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// Backend is one destination of a LoadBalancer.
type Backend struct {
	Addr string
	// ReadyURL is probed over HTTP; a backend receives new connections while it answers 200.
	ReadyURL string
}

// LoadBalancer forwards TCP connections round-robin to backends, as a Service in front of the
// webhook's Deployment does: only to backends whose readiness probe passes, and, when dialing one
// fails (it was killed since the last probe), to the next. TLS goes through untouched: the API
// server talks to the webhook process itself.
type LoadBalancer struct {
	l        net.Listener
	backends []*lbBackend
	next     atomic.Uint64
	// failedDials counts dials to a backend that failed; refused counts client connections no
	// backend took (the API server's call then fails, and failurePolicy decides).
	failedDials, refused atomic.Int64
	stop                 chan struct{}
	wg                   sync.WaitGroup
}

type lbBackend struct {
	Backend
	ready atomic.Bool
	conns atomic.Int64
}

// probeInterval is how often backends' readiness is probed; a killed backend is also skipped at
// once when a dial to it fails.
const probeInterval = 100 * time.Millisecond

// StartLoadBalancer listens on addr and forwards to backends.
func StartLoadBalancer(addr string, backends []Backend) (*LoadBalancer, error) {
	var lc net.ListenConfig
	l, err := lc.Listen(context.Background(), "tcp", addr)
	if err != nil {
		return nil, err
	}
	lb := &LoadBalancer{l: l, stop: make(chan struct{})}
	for _, b := range backends {
		lb.backends = append(lb.backends, &lbBackend{Backend: b})
	}
	lb.wg.Go(lb.probe)
	lb.wg.Go(lb.serve)
	return lb, nil
}

// Addr is where the load balancer listens.
func (lb *LoadBalancer) Addr() string { return lb.l.Addr().String() }

func (lb *LoadBalancer) probe() {
	wait.Until(func() {
		for _, b := range lb.backends {
			b.ready.Store(healthy(lbProbeClient, b.ReadyURL) == nil)
		}
	}, probeInterval, lb.stop)
}

var lbProbeClient = newProbeClient(500 * time.Millisecond)

func (lb *LoadBalancer) serve() {
	for {
		conn, err := lb.l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		lb.wg.Go(func() { lb.forward(conn) })
	}
}

// backendDialer gives up on a backend after a second.
var backendDialer = &net.Dialer{Timeout: time.Second}

// dial picks a backend: ready ones first, round-robin; when none of them answers, any that does
// (its probe may lag a restart).
func (lb *LoadBalancer) dial() (net.Conn, *lbBackend) {
	n := len(lb.backends)
	start := int(lb.next.Add(1))
	for _, readyOnly := range []bool{true, false} {
		for k := range n {
			b := lb.backends[(start+k)%n]
			if readyOnly != b.ready.Load() {
				continue
			}
			conn, err := backendDialer.DialContext(context.Background(), "tcp", b.Addr)
			if err == nil {
				return conn, b
			}
			lb.failedDials.Add(1)
			b.ready.Store(false)
		}
	}
	return nil, nil
}

func (lb *LoadBalancer) forward(client net.Conn) {
	defer client.Close()
	backend, b := lb.dial()
	if backend == nil {
		lb.refused.Add(1)
		return
	}
	defer backend.Close()
	b.conns.Add(1)
	done := make(chan struct{}, 2)
	pipe := func(dst, src net.Conn) {
		_, _ = io.Copy(dst, src)
		// Half-close is not enough when one side dies: end both directions.
		_ = dst.Close()
		_ = src.Close()
		done <- struct{}{}
	}
	go pipe(backend, client)
	go pipe(client, backend)
	select {
	case <-done:
	case <-lb.stop:
	}
}

// LoadBalancerCounts are what the load balancer did.
type LoadBalancerCounts struct {
	// Conns is the number of connections forwarded to each backend.
	Conns []int64
	// FailedDials: dials to a backend that failed (it was down); Refused: connections no backend
	// took.
	FailedDials, Refused int64
}

// Counts returns the counts so far.
func (lb *LoadBalancer) Counts() LoadBalancerCounts {
	c := LoadBalancerCounts{FailedDials: lb.failedDials.Load(), Refused: lb.refused.Load()}
	for _, b := range lb.backends {
		c.Conns = append(c.Conns, b.conns.Load())
	}
	return c
}

// Close stops listening and ends every forwarded connection.
func (lb *LoadBalancer) Close() {
	select {
	case <-lb.stop:
		return
	default:
	}
	close(lb.stop)
	_ = lb.l.Close()
	lb.wg.Wait()
}
