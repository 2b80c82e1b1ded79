package harness

import (
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// Faults says which share of the requests through a FaultProxy fail, and how. Each share is of
// all requests, drawn independently per request; their sum must not exceed 1.
type Faults struct {
	// TooManyRequests answers 429 with Retry-After (as API Priority and Fairness does).
	TooManyRequests float64
	// InternalError answers 500 without Retry-After.
	InternalError float64
	// Reset closes the client's connection with a TCP RST instead of answering.
	Reset float64
	// Latency forwards the request after Delay.
	Latency float64
	Delay   time.Duration
	// RetryAfter is the Retry-After of a 429, in seconds (at least 1).
	RetryAfter int
}

// FaultCounts are what a FaultProxy did.
type FaultCounts struct {
	Requests, TooManyRequests, InternalError, Reset, Delayed int64
}

// Injected is the number of requests that met a fault.
func (c FaultCounts) Injected() int64 {
	return c.TooManyRequests + c.InternalError + c.Reset + c.Delayed
}

// Since is what was counted after earlier.
func (c FaultCounts) Since(earlier FaultCounts) FaultCounts {
	return FaultCounts{
		Requests: c.Requests - earlier.Requests, TooManyRequests: c.TooManyRequests - earlier.TooManyRequests,
		InternalError: c.InternalError - earlier.InternalError, Reset: c.Reset - earlier.Reset, Delayed: c.Delayed - earlier.Delayed,
	}
}

// Plus is the sum of both counts.
func (c FaultCounts) Plus(other FaultCounts) FaultCounts {
	return FaultCounts{
		Requests: c.Requests + other.Requests, TooManyRequests: c.TooManyRequests + other.TooManyRequests,
		InternalError: c.InternalError + other.InternalError, Reset: c.Reset + other.Reset, Delayed: c.Delayed + other.Delayed,
	}
}

func (c FaultCounts) String() string {
	return fmt.Sprintf("%d requests: %d answered 429, %d answered 500, %d reset, %d delayed",
		c.Requests, c.TooManyRequests, c.InternalError, c.Reset, c.Delayed)
}

// FaultProxy is a reverse proxy on loopback in front of the kube-apiserver that injects faults
// into a share of the requests. It forwards with the identity of the kubeconfig it was made from
// (its client certificate), so RBAC applies as without it; its own Kubeconfig points at it over
// plain HTTP on loopback.
type FaultProxy struct {
	*LoopbackProxy

	faults                                       atomic.Pointer[Faults]
	requests, tooMany, internal, resets, delayed atomic.Int64

	mu  sync.Mutex
	rng *rand.Rand
}

// StartFaultProxy starts a proxy to the API server that authenticates as the user of
// upstreamKubeconfig, and writes <name>.kubeconfig in the control plane's directory. It injects
// nothing until Set.
func (cp *ControlPlane) StartFaultProxy(name, upstreamKubeconfig string, seed uint64) (*FaultProxy, error) {
	p := &FaultProxy{rng: rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))}
	p.faults.Store(&Faults{})
	proxy, err := StartLoopbackProxy(cp.Dir, name, upstreamKubeconfig, p.serve)
	if err != nil {
		return nil, err
	}
	p.LoopbackProxy = proxy
	return p, nil
}

// Set changes the faults injected from now on.
func (p *FaultProxy) Set(f Faults) {
	if f.RetryAfter < 1 {
		f.RetryAfter = 1
	}
	p.faults.Store(&f)
}

// Counts returns what the proxy did so far.
func (p *FaultProxy) Counts() FaultCounts {
	return FaultCounts{
		Requests: p.requests.Load(), TooManyRequests: p.tooMany.Load(), InternalError: p.internal.Load(),
		Reset: p.resets.Load(), Delayed: p.delayed.Load(),
	}
}

// Close stops the proxy and ends the connections through it.

func (p *FaultProxy) draw() float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.rng.Float64()
}

func (p *FaultProxy) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	p.requests.Add(1)
	f := p.faults.Load()
	x := p.draw()
	switch {
	case x < f.TooManyRequests:
		p.tooMany.Add(1)
		w.Header().Set("Retry-After", fmt.Sprint(f.RetryAfter))
		writeStatus(w, apierrors.NewTooManyRequests("injected by the fault proxy", f.RetryAfter).ErrStatus)
		return
	case x < f.TooManyRequests+f.InternalError:
		p.internal.Add(1)
		writeStatus(w, apierrors.NewInternalError(errors.New("injected by the fault proxy")).ErrStatus)
		return
	case x < f.TooManyRequests+f.InternalError+f.Reset:
		p.resets.Add(1)
		reset(w)
		return
	case x < f.TooManyRequests+f.InternalError+f.Reset+f.Latency:
		p.delayed.Add(1)
		select {
		case <-time.After(f.Delay):
		case <-r.Context().Done():
			return
		}
	}
	next.ServeHTTP(w, r)
}

func writeStatus(w http.ResponseWriter, status metav1.Status) {
	status.Kind, status.APIVersion = "Status", "v1"
	body, err := json.Marshal(status)
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(int(status.Code))
	// A failed write is the client's connection gone: nobody left to tell.
	_, _ = w.Write(append(body, '\n'))
}

// reset aborts the connection with a TCP RST: the client sees "connection reset by peer" with
// no response, as when a load balancer or the API server dies mid-request.
func reset(w http.ResponseWriter) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		panic(http.ErrAbortHandler)
	}
	conn, _, err := hj.Hijack()
	if err != nil {
		panic(http.ErrAbortHandler)
	}
	if tcp, ok := conn.(*net.TCPConn); ok {
		_ = tcp.SetLinger(0)
	}
	_ = conn.Close()
}
