package main

import (
	"testing"
	"time"
)

func TestFitIPAMWait(t *testing.T) {
	for _, tc := range []struct {
		name           string
		wait, takeOver time.Duration
		setByHand      bool
		want           time.Duration
		wantErr        bool
	}{
		{name: "defaults", wait: 3 * time.Second, takeOver: 5 * time.Second, want: 3 * time.Second},
		{name: "off", wait: 0, takeOver: 0, want: 0},
		{name: "default lowered for a short take-over delay", wait: 3 * time.Second, takeOver: 2 * time.Second, want: time.Second},
		{name: "set by hand above the take-over delay", wait: 3 * time.Second, takeOver: 2 * time.Second, setByHand: true, wantErr: true},
		{name: "negative", wait: -time.Second, takeOver: 5 * time.Second, setByHand: true, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := options{ipamWait: tc.wait, handOverDelay: tc.takeOver}
			err := o.fitIPAMWait(tc.setByHand)
			if (err != nil) != tc.wantErr {
				t.Fatalf("error %v, want error %v", err, tc.wantErr)
			}
			if err == nil && o.ipamWait != tc.want {
				t.Errorf("--handover-ipam-wait %s, want %s", o.ipamWait, tc.want)
			}
		})
	}
}
