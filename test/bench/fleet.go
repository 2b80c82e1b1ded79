package main

import (
	"context"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/metal3-community/ip-preallocator/test/harness"
)

const (
	// fleetNamespaces is how many namespaces the standing fleet is spread over.
	fleetNamespaces = 10
	// fleetQuiet is how long no IPAM may write to the fleet before the first run starts.
	fleetQuiet = 10 * time.Second
	// fleetSettleLimit bounds the wait for the IPAMs to finish with the fleet.
	fleetSettleLimit = 30 * time.Minute
)

// settleFleet waits until no IPAM writes to the standing fleet for fleetQuiet. A cluster's
// fleet is answered as its IPAMs leave it; a run during which an IPAM catches up on the fleet
// measures that work, not the webhook.
func settleFleet(ctx context.Context, cp *harness.ControlPlane, out io.Writer) (time.Duration, error) {
	start := time.Now()
	for {
		offset, err := cp.AuditOffset()
		if err != nil {
			return 0, err
		}
		select {
		case <-ctx.Done():
			return 0, ctx.Err()
		case <-time.After(fleetQuiet):
		}
		events, err := cp.AuditSince(offset)
		if err != nil {
			return 0, err
		}
		writes := fleetWrites(events)
		if writes == 0 {
			fmt.Fprintf(out, "The IPAMs left the standing fleet alone for %s, %s after it was written\n", fleetQuiet, time.Since(start).Round(time.Second))
			return time.Since(start), nil
		}
		if time.Since(start) > fleetSettleLimit {
			return 0, fmt.Errorf("the IPAMs still write to the standing fleet after %s (%d writes in %s)", fleetSettleLimit, writes, fleetQuiet)
		}
	}
}

// fleetWrites counts the IPAMs' writes to the standing fleet's namespaces.
func fleetWrites(events []harness.AuditEvent) int {
	n := 0
	for _, e := range events {
		switch component(e, "") {
		case "metal3-ipam", "in-cluster-ipam":
		default:
			continue
		}
		if strings.HasPrefix(e.ObjectRef.Namespace, harness.FleetNamespacePrefix) && isWrite(e.Verb) {
			n++
		}
	}
	return n
}

func isWrite(verb string) bool {
	switch verb {
	case "create", "update", "patch", "delete", "deletecollection":
		return true
	}
	return false
}
