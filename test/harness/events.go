package harness

import (
	"context"
	"regexp"

	eventsv1 "k8s.io/api/events/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// leftToCAPM3 matches how the webhook names a claim it left to CAPM3 in its warnings.
var leftToCAPM3 = regexp.MustCompile(`(IPClaim|IPAddressClaim) (\S+) left to CAPM3`)

// ClaimsLeftToCAPM3 lists, as kind/name, the claims the webhook said it left to CAPM3 in the
// PreallocationIncomplete Events of namespace: a claim it could not create, or that CAPM3
// created first (the admission answers once the creates are sent, before they are stored).
func ClaimsLeftToCAPM3(ctx context.Context, c client.Reader, namespace string) (map[string]bool, error) {
	return claimsLeftToCAPM3(ctx, c, namespace, func(eventsv1.Event) string { return "" })
}

// ClaimsLeftToCAPM3For lists them as uid/kind/name, uid that of the Metal3Data the Event is
// about: a claim of the same name left to CAPM3 for another Metal3Data does not count.
func ClaimsLeftToCAPM3For(ctx context.Context, c client.Reader, namespace string) (map[string]bool, error) {
	return claimsLeftToCAPM3(ctx, c, namespace, func(e eventsv1.Event) string { return string(e.Regarding.UID) + "/" })
}

func claimsLeftToCAPM3(ctx context.Context, c client.Reader, namespace string, prefix func(eventsv1.Event) string) (map[string]bool, error) {
	list := &eventsv1.EventList{}
	if err := c.List(ctx, list, client.InNamespace(namespace)); err != nil {
		return nil, err
	}
	left := map[string]bool{}
	for _, e := range list.Items {
		if e.Reason != "PreallocationIncomplete" {
			continue
		}
		for _, m := range leftToCAPM3.FindAllStringSubmatch(e.Note, -1) {
			left[prefix(e)+m[1]+"/"+m[2]] = true
		}
	}
	return left, nil
}
