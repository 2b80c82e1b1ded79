package mutate

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"
)

// Deletions remembers which Metal3Data this replica saw deleted within Window: CAPM3 releases their
// claims by name, and from a lagging cache also those preallocated for a new one of the same name,
// which stock CAPM3 creates only from a cache that has seen the deletion.
type Deletions struct {
	Window time.Duration

	mu sync.Mutex
	at map[types.NamespacedName]time.Time
}

// OnDelete is the informer's DeleteFunc for Metal3Data.
func (d *Deletions) OnDelete(obj any) {
	if tombstone, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tombstone.Obj
	}
	m, err := meta.Accessor(obj)
	if err != nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	now := time.Now()
	if d.at == nil {
		d.at = map[types.NamespacedName]time.Time{}
	}
	for k, at := range d.at {
		if now.Sub(at) > d.Window {
			delete(d.at, k)
		}
	}
	d.at[types.NamespacedName{Namespace: m.GetNamespace(), Name: m.GetName()}] = now
}

// Since tells how long ago a Metal3Data named key was deleted, if within Window.
func (d *Deletions) Since(key types.NamespacedName) (time.Duration, bool) {
	if d == nil {
		return 0, false
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	at, ok := d.at[key]
	if !ok || time.Since(at) > d.Window {
		return 0, false
	}
	return time.Since(at), true
}
