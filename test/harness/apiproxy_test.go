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
	get := func() (*http.Response, string, error) {
		resp, err := (&http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{DisableKeepAlives: true}}).Get(p.URL + "/api")
		if err != nil {
			return nil, "", err
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, string(body), nil
	}

	if resp, body, err := get(); err != nil || resp.StatusCode != 200 || body != "from upstream" {
		t.Fatalf("no faults: %v %v %q", resp, err, body)
	}
	p.Set(Faults{TooManyRequests: 1, RetryAfter: 2})
	if resp, body, err := get(); err != nil || resp.StatusCode != 429 || resp.Header.Get("Retry-After") != "2" || !strings.Contains(body, `"reason":"TooManyRequests"`) {
		t.Errorf("429: %v %v %q", resp, err, body)
	}
	p.Set(Faults{InternalError: 1})
	if resp, body, err := get(); err != nil || resp.StatusCode != 500 || resp.Header.Get("Retry-After") != "" {
		t.Errorf("500: %v %v %q", resp, err, body)
	}
	p.Set(Faults{Reset: 1})
	if _, _, err := get(); err == nil || !strings.Contains(err.Error(), "reset") && !strings.Contains(err.Error(), "EOF") {
		t.Errorf("reset: %v", err)
	}
	p.Set(Faults{Latency: 1, Delay: 200 * time.Millisecond})
	start := time.Now()
	if resp, body, err := get(); err != nil || resp.StatusCode != 200 || body != "from upstream" || time.Since(start) < 200*time.Millisecond {
		t.Errorf("latency: %v %v %q after %v", resp, err, body, time.Since(start))
	}
	want := FaultCounts{Requests: 5, TooManyRequests: 1, InternalError: 1, Reset: 1, Delayed: 1}
	if got := p.Counts(); got != want {
		t.Errorf("counts %+v, want %+v", got, want)
	}
}
