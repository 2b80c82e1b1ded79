package harness

import (
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

// TestFaultProxy sends requests through a FaultProxy to a TLS server standing in for the API
// server, with each fault at a share of 1, and checks what the client sees and what is counted.
func TestFaultProxy(t *testing.T) {
	upstream := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		fmt.Fprint(w, "from upstream")
	}))
	defer upstream.Close()
	dir := t.TempDir()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters["upstream"] = &clientcmdapi.Cluster{
		Server:                   upstream.URL,
		CertificateAuthorityData: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: upstream.Certificate().Raw}),
	}
	cfg.AuthInfos["upstream"] = &clientcmdapi.AuthInfo{}
	cfg.Contexts["upstream"] = &clientcmdapi.Context{Cluster: "upstream", AuthInfo: "upstream"}
	cfg.CurrentContext = "upstream"
	kubeconfig := filepath.Join(dir, "upstream.kubeconfig")
	if err := clientcmd.WriteToFile(*cfg, kubeconfig); err != nil {
		t.Fatal(err)
	}
	p, err := (&ControlPlane{Dir: dir}).StartFaultProxy("proxy", kubeconfig, 1)
	if err != nil {
		t.Fatal(err)
	}
	defer p.Close()
	if _, err := clientcmd.BuildConfigFromFlags("", p.Kubeconfig); err != nil {
		t.Fatalf("the proxy's kubeconfig: %v", err)
	}
	// answer is what the client got: the response's status and header, and its body read.
	type answer struct {
		status int
		header http.Header
		body   string
	}
	get := func() (answer, error) {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, p.URL+"/api", http.NoBody)
		if err != nil {
			return answer{}, err
		}
		resp, err := (&http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}).Do(req)
		if err != nil {
			return answer{}, err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return answer{status: resp.StatusCode, header: resp.Header, body: string(body)}, nil
	}

	if a, err := get(); err != nil || a.status != 200 || a.body != "from upstream" {
		t.Fatalf("no faults: %+v %v", a, err)
	}
	p.Set(Faults{TooManyRequests: 1, RetryAfter: 2})
	if a, err := get(); err != nil || a.status != 429 || a.header.Get("Retry-After") != "2" || !strings.Contains(a.body, `"reason":"TooManyRequests"`) {
		t.Errorf("429: %+v %v", a, err)
	}
	p.Set(Faults{InternalError: 1})
	if a, err := get(); err != nil || a.status != 500 || a.header.Get("Retry-After") != "" {
		t.Errorf("500: %+v %v", a, err)
	}
	p.Set(Faults{Reset: 1})
	if _, err := get(); err == nil || !strings.Contains(err.Error(), "reset") && !strings.Contains(err.Error(), "EOF") {
		t.Errorf("reset: %v", err)
	}
	p.Set(Faults{Latency: 1, Delay: 200 * time.Millisecond})
	start := time.Now()
	if a, err := get(); err != nil || a.status != 200 || a.body != "from upstream" || time.Since(start) < 200*time.Millisecond {
		t.Errorf("latency: %+v %v after %v", a, err, time.Since(start))
	}
	want := FaultCounts{Requests: 5, TooManyRequests: 1, InternalError: 1, Reset: 1, Delayed: 1}
	if got := p.Counts(); got != want {
		t.Errorf("counts %+v, want %+v", got, want)
	}
}
