//go:build tools

// Package etcd pins the etcd server the test control plane runs.
package etcd

import _ "go.etcd.io/etcd/server/v3"
