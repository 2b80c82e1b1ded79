package main

import (
	"testing"
	"time"

	"github.com/spf13/pflag"
	logsv1 "k8s.io/component-base/logs/api/v1"
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
