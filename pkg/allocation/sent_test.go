package allocation

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path"
	"sync/atomic"
	"testing"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
)

// TestSentBeforeStored: over HTTP/2 and TLS, as to the API server, a claim's create, or the
// reclaim of one an earlier admission of the name left waiting, is reported sent while the server
// still holds its answer, so admission can answer before the claims are stored and still know they
// reached the API server first.
func TestSentBeforeStored(t *testing.T) {
	t.Run("create", func(t *testing.T) { testSentBeforeStored(t, nil) })
	t.Run("reclaim", func(t *testing.T) {
		var waiting []client.Object
		for _, c := range plannedClaims() {
			waiting = append(waiting, c.preallocated("earlier-admission"))
		}
		testSentBeforeStored(t, waiting)
	})
}

func testSentBeforeStored(t *testing.T, existing []client.Object) {
	t.Helper()
	release := make(chan struct{})
	var received, patches atomic.Int32
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		received.Add(1)
		<-release
		w.Header().Set("Content-Type", "application/json")
		if r.Method == http.MethodPatch {
			patches.Add(1)
			_, _ = fmt.Fprintf(w, `{"kind":"PartialObjectMetadata","apiVersion":"meta.k8s.io/v1","metadata":{"name":%q}}`, path.Base(r.URL.Path))
			return
		}
		w.WriteHeader(http.StatusCreated)
		var obj map[string]any
		_ = json.Unmarshal(body, &obj)
		_ = json.NewEncoder(w).Encode(obj)
	}))
	srv.EnableHTTP2 = true
	srv.StartTLS()
	defer srv.Close()

	mapper := meta.NewDefaultRESTMapper(nil)
	mapper.Add(IPClaimGVK, meta.RESTScopeNamespace)
	mapper.Add(IPAddressClaimGVK, meta.RESTScopeNamespace)
	cfg := &rest.Config{Host: srv.URL, TLSClientConfig: rest.TLSClientConfig{Insecure: true}}
	c, err := client.New(cfg, client.Options{Scheme: fixtures.Scheme(), Mapper: mapper})
	if err != nil {
		t.Fatal(err)
	}
	cache := fakeClient(nil, existing...)
	creator := &Creator{Client: c, Cache: cache, APIReader: cache}

	claims := plannedClaims()
	var sent atomic.Int32
	allSent := make(chan struct{})
	results := make(chan []Result, 1)
	go func() {
		results <- creator.Create(context.Background(), "tmpl-0", "this-admission", claims, func() {
			if sent.Add(1) == int32(len(claims)) {
				close(allSent)
			}
		})
	}()
	select {
	case <-allSent:
	case <-time.After(10 * time.Second):
		close(release)
		t.Fatalf("%d of %d requests reported sent", sent.Load(), len(claims))
	}
	// Every request is still unanswered here; the server has them, or is reading them.
	for deadline := time.Now().Add(5 * time.Second); received.Load() != int32(len(claims)); time.Sleep(10 * time.Millisecond) {
		if time.Now().After(deadline) {
			close(release)
			t.Fatalf("the server received %d of %d requests", received.Load(), len(claims))
		}
	}
	close(release)
	want := Created
	if existing != nil {
		want = Reused
	}
	for _, r := range <-results {
		if r.Outcome != want {
			t.Errorf("%s %s: %s (%v), want %s", r.Claim.Kind(), r.Name, r.Outcome, r.Err, want)
		}
	}
	if existing != nil && patches.Load() != int32(len(claims)) {
		t.Errorf("%d reclaim patches, want %d", patches.Load(), len(claims))
	}
}
