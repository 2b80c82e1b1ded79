package memory

import (
	"time"

	"k8s.io/apimachinery/pkg/types"
)

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
