package harness

import (
	"bufio"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"
)

// backendFixture is a TCP server that answers every line with its name, and a readiness endpoint.
type backendFixture struct {
	name  string
	l     net.Listener
	ready *httptest.Server
}

func newBackend(t *testing.T, name string) *backendFixture {
	t.Helper()
	var lc net.ListenConfig
	l, err := lc.Listen(t.Context(), "tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			conn, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer conn.Close()
				if _, err := bufio.NewReader(conn).ReadString('\n'); err == nil {
					_, _ = conn.Write([]byte(name + "\n"))
				}
			}()
		}
	}()
	ready := httptest.NewServer(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {}))
	return &backendFixture{name: name, l: l, ready: ready}
}

func (b *backendFixture) backend() Backend {
	return Backend{Addr: b.l.Addr().String(), ReadyURL: b.ready.URL}
}

// kill stops accepting connections and answering the probe, as a killed process.
func (b *backendFixture) kill() {
	_ = b.l.Close()
	b.ready.Close()
}

func ask(t *testing.T, addr string) string {
	t.Helper()
	conn, err := (&net.Dialer{Timeout: time.Second}).DialContext(t.Context(), "tcp", addr)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	_ = conn.SetDeadline(time.Now().Add(2 * time.Second))
	if _, err := conn.Write([]byte("hello\n")); err != nil {
		return ""
	}
	line, err := bufio.NewReader(conn).ReadString('\n')
	if err != nil {
		return ""
	}
	return line[:len(line)-1]
}

// TestLoadBalancer: connections alternate between live backends, skip a killed one at once (before
// its probe fails), and are refused when none is left.
func TestLoadBalancer(t *testing.T) {
	a, b := newBackend(t, "a"), newBackend(t, "b")
	defer a.ready.Close()
	defer b.ready.Close()
	lb, err := StartLoadBalancer("127.0.0.1:0", []Backend{a.backend(), b.backend()})
	if err != nil {
		t.Fatal(err)
	}
	defer lb.Close()
	time.Sleep(3 * probeInterval)
	seen := map[string]int{}
	for range 10 {
		seen[ask(t, lb.Addr())]++
	}
	if seen["a"] != 5 || seen["b"] != 5 {
		t.Errorf("round-robin over two ready backends: %v", seen)
	}
	a.kill()
	for range 4 {
		if got := ask(t, lb.Addr()); got != "b" {
			t.Errorf("with a killed: answered by %q", got)
		}
	}
	b.kill()
	if got := ask(t, lb.Addr()); got != "" {
		t.Errorf("with both killed: answered by %q", got)
	}
	c := lb.Counts()
	if c.Refused != 1 || c.FailedDials < 1 || c.Conns[0] != 5 || c.Conns[1] != 9 {
		t.Errorf("counts %+v", c)
	}
}
