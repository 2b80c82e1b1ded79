package handover

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

// Admissions remembers what this replica decided when it admitted a Metal3Data: the admission
// that preallocated its claims, so that this replica hands them over itself as soon as the
// Metal3Data is stored (the hand-over of a live replica never waits for the lease, and every other
// replica leaves those Metal3Data alone), and a warning for the operator, which can only be
// recorded as an Event once the Metal3Data exists.
type Admissions struct {
	// TTL bounds how long an admission whose Metal3Data is never stored is remembered.
	TTL time.Duration

	mu      sync.Mutex
	pending map[types.NamespacedName]admitted
}

type admitted struct {
	token   string
	warning string
	at      time.Time
}

// Add records this replica's admission of the Metal3Data key: token when it preallocated claims,
// warning when it skipped or left some claims to CAPM3.
func (a *Admissions) Add(key types.NamespacedName, token, warning string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	now := time.Now()
	if a.pending == nil {
		a.pending = map[types.NamespacedName]admitted{}
	}
	for k, v := range a.pending {
		if now.Sub(v.at) > a.TTL {
			delete(a.pending, k)
		}
	}
	a.pending[key] = admitted{token: token, warning: warning, at: now}
}

// Has tells whether this replica's admission token produced the Metal3Data key.
func (a *Admissions) Has(key types.NamespacedName, token string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	v, ok := a.pending[key]
	return ok && token != "" && v.token == token
}

// Pending tells whether anything is left to do for the Metal3Data key, stored with annotations.
func (a *Admissions) Pending(key types.NamespacedName, annotations map[string]string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	v, ok := a.pending[key]
	return ok && (v.warning != "" || v.token != "" && v.token == annotations[allocation.AdmissionAnnotation])
}

// TakeWarning returns the warning for the Metal3Data key, once.
func (a *Admissions) TakeWarning(key types.NamespacedName) string {
	a.mu.Lock()
	defer a.mu.Unlock()
	v, ok := a.pending[key]
	if !ok || v.warning == "" {
		return ""
	}
	warning := v.warning
	v.warning = ""
	if v.token == "" {
		delete(a.pending, key)
	} else {
		a.pending[key] = v
	}
	return warning
}

// Done forgets an admission whose claims were handed over.
func (a *Admissions) Done(key types.NamespacedName, token string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if v, ok := a.pending[key]; ok && v.token == token {
		delete(a.pending, key)
	}
}
