package stack

import (
	"context"
	"sync"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	"k8s.io/apimachinery/pkg/types"
)

// Arrival is one Metal3Data create sent by CAPM3's Metal3DataTemplate controller.
type Arrival struct {
	Data types.NamespacedName
	// Claim is the Metal3DataClaim it was created for.
	Claim string
	// Called is when the template controller called Create; the client's rate limiter waits
	// after it. Returned is when the call came back.
	Called, Returned time.Time
	// Created is false when the API server refused it (CAPM3 then requeues the template).
	Created bool
}

// Arrivals records the Metal3Data creates of CAPM3's template controller, in the order sent.
type Arrivals struct {
	mu  sync.Mutex
	all []Arrival
}

func (a *Arrivals) record(data *infrav1.Metal3Data, called time.Time, err error) {
	arrival := Arrival{
		Data:   types.NamespacedName{Namespace: data.Namespace, Name: data.Name},
		Called: called, Returned: time.Now(), Created: err == nil,
	}
	if data.Spec.Claim != nil {
		arrival.Claim = data.Spec.Claim.Name
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	a.all = append(a.all, arrival)
}

// In returns the arrivals in a namespace.
func (a *Arrivals) In(namespace string) []Arrival {
	a.mu.Lock()
	defer a.mu.Unlock()
	var out []Arrival
	for _, arrival := range a.all {
		if arrival.Data.Namespace == namespace {
			out = append(out, arrival)
		}
	}
	return out
}

// hold keeps reconciles waiting until it is released or their context ends.
type hold struct {
	once     sync.Once
	released chan struct{}
}

func newHold(held bool) *hold {
	h := &hold{released: make(chan struct{})}
	if !held {
		h.release()
	}
	return h
}

func (h *hold) release() { h.once.Do(func() { close(h.released) }) }

func (h *hold) wait(ctx context.Context) error {
	select {
	case <-h.released:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}
