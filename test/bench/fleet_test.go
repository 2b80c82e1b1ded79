package main

import (
	"testing"

	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"

	"github.com/metal3-community/ip-preallocator/test/harness"
	"github.com/metal3-community/ip-preallocator/test/stack"
)

// TestFleetWrites: only an IPAM's writes to the standing fleet's namespaces fail a run.
func TestFleetWrites(t *testing.T) {
	event := func(agent, verb, namespace string) harness.AuditEvent {
		return harness.AuditEvent{Verb: verb, UserAgent: agent, ObjectRef: &auditv1.ObjectReference{Namespace: namespace, Resource: "ipaddressclaims"}}
	}
	inCluster := "cluster-api-ipam-provider-in-cluster/v1.1.0"
	for _, tc := range []struct {
		name  string
		event harness.AuditEvent
		want  int
	}{
		{"the in-cluster IPAM answers a fleet claim", event(inCluster, "patch", "fleet-3"), 1},
		{"the Metal3 IPAM creates a fleet IPAddress", event(stack.IPAMUserAgent+"/v1.13.2", "create", "fleet-0"), 1},
		{"an IPAM reads the fleet", event(inCluster, "get", "fleet-3"), 0},
		{"an IPAM writes to the run's namespace", event(inCluster, "patch", "raised-limits-burst-stock-0"), 0},
		{"CAPM3 writes to the fleet", event(stack.CAPM3UserAgent+"/v1.13.2", "patch", "fleet-1"), 0},
	} {
		if got := fleetWrites([]harness.AuditEvent{tc.event}); got != tc.want {
			t.Errorf("%s: %d writes, want %d", tc.name, got, tc.want)
		}
	}
}
