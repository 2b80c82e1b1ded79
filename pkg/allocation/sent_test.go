package allocation

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
)

// TestSentBeforeStored: over HTTP/2 and TLS, as to the API server, a claim's create is reported
// sent while the server still holds its answer, so admission can answer before the claims are
// stored and still know they reached the API server first.
func TestSentBeforeStored(t *testing.T) {
	release := make(chan struct{})
	var received atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		received.Add(1)
		<-release
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusCreated)
		var obj map[string]any
		_ = json.Unmarshal(body, &obj)
		_ = json.NewEncoder(w).Encode(obj)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()
	defer close(release)

	mapper := meta.NewDefaultRESTMapper(nil)
	mapper.Add(IPClaimGVK, meta.RESTScopeNamespace)
	mapper.Add(IPAddressClaimGVK, meta.RESTScopeNamespace)
	cfg := &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
	c, err := client.New(cfg, client.Options{Scheme: fixtures.Scheme(), Mapper: mapper})
	if err != nil {
		t.Fatal(err)
	}
	cache := fakeClient(nil)
	creator := &Creator{Client: c, Cache: cache, APIReader: cache}

	claims := plannedClaims()
	var sent atomic.Int32
	allSent := make(chan struct{})
	go creator.Create(context.Background(), "tmpl-0", "this-admission", claims, func() {
		if sent.Add(1) == int32(len(claims)) {
			close(allSent)
		}
	})
	select {
	case <-allSent:
	case <-time.After(10 * time.Second):
		t.Fatalf("%d of %d creates reported sent", sent.Load(), len(claims))
	}
	// Every create is still unanswered here; the server has them, or is reading them.
	for deadline := time.Now().Add(5 * time.Second); received.Load() != int32(len(claims)); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			t.Fatalf("the server received %d of %d creates", received.Load(), len(claims))
		}
	}
}
