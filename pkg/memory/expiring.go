// Package memory holds the webhook's in-memory records: each expires on its own and the set is
// bounded, so that what a replica remembers of objects that never come back cannot grow.
package memory

import (
	"sync"
	"time"

	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/cache"

	"github.com/metal3-community/ip-preallocator/pkg/clock"
)

// Expiring maps keys to records that are forgotten TTL after they were last set. The zero value
// is ready to use; a zero TTL keeps records until the set is full.
type Expiring[K comparable, V any] struct {
	TTL time.Duration

	once sync.Once
	// mu makes Update's read and write one step; the cache locks only each call.
	mu      sync.Mutex
	records *cache.LRUExpireCache
}

func (e *Expiring[K, V]) cache() *cache.LRUExpireCache {
	e.once.Do(func() { e.records = cache.NewLRUExpireCache(clock.MemorySize) })
	return e.records
}

func (e *Expiring[K, V]) ttl() time.Duration {
	if e.TTL > 0 {
		return e.TTL
	}
	return time.Duration(1<<63 - 1)
}

// Get returns the record of key.
func (e *Expiring[K, V]) Get(key K) (V, bool) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.get(key)
}

func (e *Expiring[K, V]) get(key K) (V, bool) {
	v, ok := e.cache().Get(key)
	if !ok {
		var zero V
		return zero, false
	}
	return v.(V), true
}

// Set records v for key.
func (e *Expiring[K, V]) Set(key K, v V) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.cache().Add(key, v, e.ttl())
}

// Delete forgets key.
func (e *Expiring[K, V]) Delete(key K) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.cache().Remove(key)
}

// Update replaces the record of key by what change returns from it, or forgets key when change
// returns false, and returns the new record.
func (e *Expiring[K, V]) Update(key K, change func(v V, found bool) (V, bool)) V {
	e.mu.Lock()
	defer e.mu.Unlock()
	old, found := e.get(key)
	v, keep := change(old, found)
	if keep {
		e.cache().Add(key, v, e.ttl())
	} else {
		e.cache().Remove(key)
	}
	return v
}

// Range calls f with every record that has not expired.
func (e *Expiring[K, V]) Range(f func(key K, v V)) {
	e.mu.Lock()
	defer e.mu.Unlock()
	for _, k := range e.cache().Keys() {
		if v, ok := e.get(k.(K)); ok {
			f(k.(K), v)
		}
	}
}

// Sightings remember when this replica first saw each object as it is now, its UID and the
// admission token it carries: on this replica's clock, so that clock skew cannot shorten a delay.
// X is what a controller notes between two looks.
type Sightings[X any] struct {
	Expiring[types.NamespacedName, Sighting[X]]
}

// Sighting is the first sight of an object as it is now.
type Sighting[X any] struct {
	UID   types.UID
	Token string
	At    time.Time
	Noted X
}

// See returns the sighting of key as uid with token, recording it now if it is new.
func (s *Sightings[X]) See(key types.NamespacedName, uid types.UID, token string) Sighting[X] {
	now := time.Now()
	return s.Update(key, func(v Sighting[X], found bool) (Sighting[X], bool) {
		if !found || v.UID != uid || v.Token != token {
			v = Sighting[X]{UID: uid, Token: token, At: now}
		}
		return v, true
	})
}

// Note changes what is noted on the sighting of key, if there is one.
func (s *Sightings[X]) Note(key types.NamespacedName, note func(*X)) {
	s.Update(key, func(v Sighting[X], found bool) (Sighting[X], bool) {
		if found {
			note(&v.Noted)
		}
		return v, found
	})
}
