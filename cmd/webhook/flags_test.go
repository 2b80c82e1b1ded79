package main

import (
	"testing"
	"time"
)

func TestCheckFlags(t *testing.T) {
	for _, tc := range []struct {
		name    string
		wait    time.Duration
		wantErr bool
	}{
		{name: "default", wait: 30 * time.Second},
		{name: "off", wait: 0},
		{name: "negative", wait: -time.Second, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := options{ipamWait: tc.wait}
			if err := o.checkFlags(); (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want error %v", err, tc.wantErr)
			}
		})
	}
}
