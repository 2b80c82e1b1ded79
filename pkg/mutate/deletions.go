package mutate

import (
	"time"

	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/types"
	toolscache "k8s.io/client-go/tools/cache"

	"github.com/metal3-community/ip-preallocator/pkg/memory"
)

// Deletions remembers which Metal3Data this replica saw deleted lately: CAPM3 releases their
// claims by name, and from a lagging cache also those preallocated for a new one of the same name,
// which stock CAPM3 creates only from a cache that has seen the deletion.
type Deletions struct {
	at memory.Expiring[types.NamespacedName, time.Time]
}

// NewDeletions remembers a deletion for window.
func NewDeletions(window time.Duration) *Deletions {
	d := &Deletions{}
	d.at.TTL = window
	return d
}

// OnDelete is the informer's DeleteFunc for Metal3Data.
func (d *Deletions) OnDelete(obj any) {
	if tombstone, ok := obj.(toolscache.DeletedFinalStateUnknown); ok {
		obj = tombstone.Obj
	}
	if m, err := meta.Accessor(obj); err == nil {
		d.at.Set(types.NamespacedName{Namespace: m.GetNamespace(), Name: m.GetName()}, time.Now())
	}
}

// Since tells how long ago a Metal3Data named key was deleted, if lately.
func (d *Deletions) Since(key types.NamespacedName) (time.Duration, bool) {
	if d == nil {
		return 0, false
	}
	at, ok := d.at.Get(key)
	return time.Since(at), ok
}
