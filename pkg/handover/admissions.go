package handover

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
)

// Admissions remembers the Metal3Data this replica preallocated claims for, so that this replica
// hands them over itself as soon as they are stored: the hand-over of a live replica never waits
// for the lease, and every other replica leaves those Metal3Data alone.
type Admissions struct {
	// TTL bounds how long an admission whose Metal3Data is never stored is remembered.
	TTL time.Duration

	mu      sync.Mutex
	pending map[types.NamespacedName]admitted
}

type admitted struct {
	token string
	at    time.Time
}

// Add records that this replica preallocated for the Metal3Data key in the admission token.
func (a *Admissions) Add(key types.NamespacedName, token string) {
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
	a.pending[key] = admitted{token: token, at: now}
}

// Has tells whether this replica's admission token produced the Metal3Data key.
func (a *Admissions) Has(key types.NamespacedName, token string) bool {
	a.mu.Lock()
	defer a.mu.Unlock()
	v, ok := a.pending[key]
	return ok && token != "" && v.token == token
}

// Done forgets an admission whose claims were handed over.
func (a *Admissions) Done(key types.NamespacedName, token string) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if v, ok := a.pending[key]; ok && v.token == token {
		delete(a.pending, key)
	}
}
