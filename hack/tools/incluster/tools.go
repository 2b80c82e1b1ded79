//go:build tools

// Package incluster pins the Cluster API in-cluster IPAM provider the tests run for CAPI pools.
package incluster

import _ "sigs.k8s.io/cluster-api-ipam-provider-in-cluster"
