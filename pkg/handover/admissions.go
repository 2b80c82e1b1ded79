package handover

import (
	"strings"
	"time"

	"k8s.io/apimachinery/pkg/types"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/pkg/memory"
)

// Admissions remembers what this replica decided when it admitted a Metal3Data, until the
// hand-over is done with it: the claims it created, a warning for the operator (an Event needs
// the stored Metal3Data), and until when the hand-over waits for the IPAM.
type Admissions struct {
	records memory.Expiring[types.NamespacedName, admitted]
}

// NewAdmissions forgets an admission whose Metal3Data is not stored within ttl.
func NewAdmissions(ttl time.Duration) *Admissions {
	a := &Admissions{}
	a.records.TTL = ttl
	return a
}

type admitted struct {
	token string
	// dataToken is the admission token the Metal3Data carries if it is stored from this admission.
	dataToken string
	warning   string
	creating  bool
	// answerBy is when the hand-over stops waiting for the IPAM's answer; zero: it does not wait.
	answerBy time.Time
	// claims are the claims this replica created or reclaimed, to hand over.
	claims []allocation.ClaimRef
}

func (a *Admissions) admit(key types.NamespacedName, v admitted) {
	a.records.Set(key, v)
}

// created records the end of the creation of the admission token's claims.
func (a *Admissions) created(key types.NamespacedName, token string, refs []allocation.ClaimRef, warnings []string) {
	a.records.Update(key, func(v admitted, found bool) (admitted, bool) {
		if found && v.token == token {
			v.creating, v.claims = false, refs
			if v.warning != "" {
				warnings = append([]string{v.warning}, warnings...)
			}
			v.warning = strings.Join(warnings, "; ")
		}
		return v, found
	})
}

// claims returns the claims the admission token created for the Metal3Data key, once their
// creation is over, and until when their hand-over waits for the IPAM's answer; ok is false while
// they are being created or when the admission was not this replica's.
func (a *Admissions) claims(key types.NamespacedName, token string) (refs []allocation.ClaimRef, answerBy time.Time, ok bool) {
	v, found := a.records.Get(key)
	if !found || token == "" || v.token != token || v.creating {
		return nil, time.Time{}, false
	}
	return v.claims, v.answerBy, true
}

// admittedHere tells whether anything is left to do for the Metal3Data key stored with the
// admission token dataToken: only if this replica's admission left that token on it, so that a
// warning of an admission never stored is not taken for one of a Metal3Data another replica admitted.
func (a *Admissions) admittedHere(key types.NamespacedName, dataToken string) bool {
	v, ok := a.records.Get(key)
	return ok && v.dataToken == dataToken && (v.warning != "" || v.token != "")
}

// takeWarning returns, once, the warning of this replica's admission of the Metal3Data key stored
// with the admission token dataToken, once its claims are created.
func (a *Admissions) takeWarning(key types.NamespacedName, dataToken string) string {
	var warning string
	a.records.Update(key, func(v admitted, found bool) (admitted, bool) {
		if !found || v.dataToken != dataToken || v.warning == "" || v.creating {
			return v, found
		}
		warning, v.warning = v.warning, ""
		return v, v.token != ""
	})
	return warning
}

// done forgets an admission whose claims were handed over.
func (a *Admissions) done(key types.NamespacedName, token string) {
	a.records.Update(key, func(v admitted, found bool) (admitted, bool) {
		return v, found && v.token != token
	})
}
