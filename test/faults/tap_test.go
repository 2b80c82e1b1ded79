package faults

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/metal3-community/ip-preallocator/test/harness"
)

// apiTap is a pass-through proxy between one webhook replica and the API server. It tells which
// replica did what to a claim: the replica whose tap forwarded a claim's create is the one that
// admitted its Metal3Data (claims are created by the admitting replica, during or right after
// the admission), and the replica whose tap forwarded the patch that gave a claim its owner
// reference handed it over. It can also hold that replica's hand-over patches (they reach the
// API server only once released, or never if the replica dies meanwhile): a replica that dies
// after admitting and before handing over, deterministically.
type apiTap struct {
	replica    int
	kubeconfig string
	proxy      *harness.LoopbackProxy

	hold    atomic.Bool
	release chan struct{}
	held    atomic.Int64

	mu sync.Mutex
	// creates and handOvers are keyed by "<namespace>/<claim name>": when the API server
	// answered the create, or the hand-over patch, with success.
	creates   map[string]time.Time
	handOvers map[string]time.Time
}

func startAPITap(name string, replica int, upstreamKubeconfig string) (*apiTap, error) {
	t := &apiTap{replica: replica, release: make(chan struct{}), creates: map[string]time.Time{}, handOvers: map[string]time.Time{}}
	proxy, err := harness.StartLoopbackProxy(logDir, name, upstreamKubeconfig, t.serve)
	if err != nil {
		return nil, err
	}
	t.proxy = proxy
	t.kubeconfig = proxy.Kubeconfig
	return t, nil
}

func (t *apiTap) close() {
	t.stopHolding()
	t.proxy.Close()
}

// holdHandOvers makes the tap hold every hand-over patch from now on.
func (t *apiTap) holdHandOvers() { t.hold.Store(true) }

// stopHolding forwards the held patches (of a replica still alive) and holds no more.
func (t *apiTap) stopHolding() {
	if t.hold.CompareAndSwap(true, false) {
		close(t.release)
	}
}

// claimPath returns "<namespace>/<name>" of a request to IPClaims or IPAddressClaims (name empty
// for a create), and whether it is one.
func claimPath(path string) (ns, name string, ok bool) {
	parts := strings.Split(strings.Trim(path, "/"), "/")
	for i := 0; i+2 < len(parts); i++ {
		if parts[i] != "namespaces" {
			continue
		}
		if r := parts[i+2]; r != "ipclaims" && r != "ipaddressclaims" {
			return "", "", false
		}
		if i+3 < len(parts) {
			name = parts[i+3]
		}
		// A subresource (status) is not the claim's metadata.
		if i+4 < len(parts) {
			return "", "", false
		}
		return parts[i+1], name, true
	}
	return "", "", false
}

// isHandOver tells a patch that adds owner references (a JSON patch adding
// /metadata/ownerReferences, or another patch setting them).
func isHandOver(contentType string, body []byte) bool {
	if strings.Contains(contentType, "json-patch") {
		var ops []struct {
			Op   string `json:"op"`
			Path string `json:"path"`
		}
		if json.Unmarshal(body, &ops) != nil {
			return false
		}
		for _, op := range ops {
			if (op.Op == "add" || op.Op == "replace") && strings.HasPrefix(op.Path, "/metadata/ownerReferences") {
				return true
			}
		}
		return false
	}
	return bytes.Contains(body, []byte(`"ownerReferences"`))
}

// statusWriter remembers the status code of a response.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (w *statusWriter) WriteHeader(code int) {
	w.code = code
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

func (t *apiTap) serve(w http.ResponseWriter, r *http.Request, next http.Handler) {
	ns, name, ok := claimPath(r.URL.Path)
	if !ok || (r.Method != http.MethodPost && r.Method != http.MethodPatch && r.Method != http.MethodPut) {
		next.ServeHTTP(w, r)
		return
	}
	body, err := io.ReadAll(r.Body)
	if err != nil {
		return
	}
	r.Body = io.NopCloser(bytes.NewReader(body))
	handOver := r.Method != http.MethodPost && isHandOver(r.Header.Get("Content-Type"), body)
	if r.Method == http.MethodPost {
		var obj struct {
			Metadata struct {
				Name string `json:"name"`
			} `json:"metadata"`
		}
		_ = json.Unmarshal(body, &obj)
		name = obj.Metadata.Name
	}
	if handOver && t.hold.Load() {
		t.held.Add(1)
		select {
		case <-r.Context().Done():
			// The replica died: the patch never reaches the API server.
			return
		case <-t.release:
		}
	}
	sw := &statusWriter{ResponseWriter: w, code: http.StatusOK}
	next.ServeHTTP(sw, r)
	if sw.code/100 != 2 || name == "" {
		return
	}
	key := ns + "/" + name
	now := time.Now()
	t.mu.Lock()
	defer t.mu.Unlock()
	switch {
	case r.Method == http.MethodPost:
		if _, ok := t.creates[key]; !ok {
			t.creates[key] = now
		}
	case handOver:
		if _, ok := t.handOvers[key]; !ok {
			t.handOvers[key] = now
		}
	}
}

// created tells when this replica created the claim ns/name, if it did.
func (t *apiTap) created(key string) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.creates[key]
	return at, ok
}

// handedOver tells when this replica handed the claim ns/name over, if it did.
func (t *apiTap) handedOver(key string) (time.Time, bool) {
	t.mu.Lock()
	defer t.mu.Unlock()
	at, ok := t.handOvers[key]
	return at, ok
}

// createdSince counts the claims this replica created after since.
func (t *apiTap) createdSince(since time.Time) int {
	t.mu.Lock()
	defer t.mu.Unlock()
	n := 0
	for _, at := range t.creates {
		if !at.Before(since) {
			n++
		}
	}
	return n
}
