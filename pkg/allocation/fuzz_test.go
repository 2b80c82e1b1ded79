package allocation

import (
	"slices"
	"testing"

	"github.com/metal3-community/ip-preallocator/pkg/clock"
)

// FuzzParseClaims: whatever a person writes into the record, parsing never panics, stays
// bounded, names only valid claims of the Metal3Data's namespace, and round-trips.
func FuzzParseClaims(f *testing.F) {
	for _, seed := range []string{"", "IPClaim/a", "IPClaim/a,IPAddressClaim/b", "IPClaim/a,IPClaim/a", "IPClaim/ns/a", "Secret/a", ",", "IPClaim/"} {
		f.Add(seed)
	}
	f.Fuzz(func(t *testing.T, value string) {
		refs, err := ParseClaims(value)
		if err != nil {
			return
		}
		if len(refs) > clock.MaxRecordedClaims {
			t.Fatalf("%d refs", len(refs))
		}
		for i, r := range refs {
			if _, err := r.GVK(); err != nil {
				t.Fatalf("ref %v: %v", r, err)
			}
			if slices.Contains(refs[:i], r) {
				t.Fatalf("duplicate %v", r)
			}
		}
		again, err := ParseClaims(FormatClaims(refs))
		if err != nil || !slices.Equal(again, refs) {
			t.Fatalf("round trip of %v: %v, %v", refs, again, err)
		}
	})
}
