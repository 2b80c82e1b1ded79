package main

import (
	"testing"
	"time"

	"github.com/spf13/pflag"
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
