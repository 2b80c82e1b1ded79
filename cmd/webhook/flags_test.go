package main

import (
	"testing"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	logsv1 "k8s.io/component-base/logs/api/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

func TestCheckFlags(t *testing.T) {
	var defaults options
	defaults.addFlags(pflag.NewFlagSet("webhook", pflag.ContinueOnError))
	if err := defaults.checkFlags(); err != nil {
		t.Fatalf("the defaults: %v", err)
	}
	for _, tc := range []struct {
		name    string
		wait    time.Duration
		wantErr bool
	}{
		{name: "off", wait: 0},
		{name: "negative", wait: -time.Second, wantErr: true},
		{name: "beyond the release grace period", wait: 2 * defaults.releaseGrace},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := defaults
			o.ipamWait = tc.wait
			if err := o.checkFlags(); (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want error %v", err, tc.wantErr)
			}
		})
	}
}

// TestFlagsLikeCAPIProviders: the logging format and the leader election timings parse and reach
// the options, as in every Cluster API provider.
func TestFlagsLikeCAPIProviders(t *testing.T) {
	var o options
	fs := pflag.NewFlagSet("webhook", pflag.ContinueOnError)
	o.addFlags(fs)
	if err := fs.Parse([]string{"--logging-format=json", "--v=3", "--leader-elect-lease-duration=30s",
		"--leader-elect-renew-deadline=20s", "--leader-elect-retry-period=4s"}); err != nil {
		t.Fatal(err)
	}
	if o.logs.Format != "json" || o.logs.Verbosity != 3 {
		t.Errorf("logging format %q, verbosity %d", o.logs.Format, o.logs.Verbosity)
	}
	if o.leaseDuration != 30*time.Second || o.renewDeadline != 20*time.Second || o.retryPeriod != 4*time.Second {
		t.Errorf("leader election %v %v %v", o.leaseDuration, o.renewDeadline, o.retryPeriod)
	}
	if err := fs.Parse([]string{"--logging-format=xml"}); err == nil {
		if err := logsv1.Validate(o.logs, nil, nil); len(err) == 0 {
			t.Error("logging format xml accepted")
		}
	}
}

// TestScopedCaches: --namespace restricts every informer to that namespace; --watch-filter the
// Metal3Data and the claims, which carry its label.
func TestScopedCaches(t *testing.T) {
	if opts := cacheOptions(options{}); opts.DefaultNamespaces != nil || len(opts.ByObject) != 1 {
		t.Errorf("unscoped: %+v", opts)
	}
	opts := cacheOptions(options{namespace: "plane-a", watchFilter: "a"})
	if _, ok := opts.DefaultNamespaces["plane-a"]; !ok || len(opts.DefaultNamespaces) != 1 {
		t.Errorf("namespaces %v", opts.DefaultNamespaces)
	}
	kinds := map[string]bool{}
	for obj, by := range opts.ByObject {
		if _, ok := obj.(*infrav1.Metal3Machine); ok {
			continue
		}
		kinds[obj.GetObjectKind().GroupVersionKind().Kind] = true
		if by.Label.String() != "cluster.x-k8s.io/watch-filter=a" {
			t.Errorf("%T: label selector %q", obj, by.Label)
		}
	}
	for _, kind := range []string{"Metal3Data", "IPClaim", "IPAddressClaim"} {
		if !kinds[kind] {
			t.Errorf("no label selector for %s: %v", kind, kinds)
		}
	}
}

// TestMetal3MachineAsRead: the cache keeps of a Metal3Machine what admission reads (annotations,
// owners, the template) and nothing of its status, the rest of its spec or its managed fields.
func TestMetal3MachineAsRead(t *testing.T) {
	in := &infrav1.Metal3Machine{
		ObjectMeta: metav1.ObjectMeta{
			Name: "m3m", Namespace: "ns",
			Annotations:     map[string]string{"metal3.io/BareMetalHost": "ns/host", "pool": "provisioning"},
			OwnerReferences: []metav1.OwnerReference{{Kind: "Machine", Name: "machine"}},
			ManagedFields:   []metav1.ManagedFieldsEntry{{Manager: "capm3"}},
		},
		Spec: infrav1.Metal3MachineSpec{
			DataTemplate: &infrav1.Metal3ObjectRef{Name: "workers"},
			Image:        infrav1.Image{URL: "http://images.example.com/node.qcow2"},
		},
		Status: infrav1.Metal3MachineStatus{RenderedData: &infrav1.Metal3ObjectRef{Name: "workers-0"}, Addresses: []clusterv1.MachineAddress{{Type: "InternalIP", Address: "10.0.0.1"}}},
	}
	out, err := metal3MachineAsRead(in.DeepCopy())
	if err != nil {
		t.Fatal(err)
	}
	want := &infrav1.Metal3Machine{ObjectMeta: *in.ObjectMeta.DeepCopy(), Spec: infrav1.Metal3MachineSpec{DataTemplate: in.Spec.DataTemplate}}
	want.ManagedFields = nil
	if !equality.Semantic.DeepEqual(out, want) {
		t.Errorf("cached %+v, want %+v", out, want)
	}
	other := &metav1.PartialObjectMetadata{}
	if got, _ := metal3MachineAsRead(other); got != other {
		t.Errorf("another kind was changed: %+v", got)
	}
}
