package main

import (
	"context"
	"strings"
	"testing"
	"time"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/pkg/mutate"
)

func configuration(name, namespace string, age time.Duration) *admissionregistrationv1.MutatingWebhookConfiguration {
	return &admissionregistrationv1.MutatingWebhookConfiguration{
		ObjectMeta: metav1.ObjectMeta{Name: name, CreationTimestamp: metav1.NewTime(time.Now().Add(-age).Truncate(time.Second))},
		Webhooks: []admissionregistrationv1.MutatingWebhook{
			{Name: "other.example.com", ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: "elsewhere"}}},
			{Name: mutate.WebhookName, ClientConfig: admissionregistrationv1.WebhookClientConfig{Service: &admissionregistrationv1.ServiceReference{Namespace: namespace, Name: "webhook-service"}}},
		},
	}
}

func TestRefuseSecondInstall(t *testing.T) {
	url := configuration("url", "", time.Hour)
	url.Webhooks[1].ClientConfig = admissionregistrationv1.WebhookClientConfig{URL: new("https://127.0.0.1:9443/mutate")}
	for _, tc := range []struct {
		name    string
		configs []client.Object
		refused string
	}{
		{name: "alone", configs: []client.Object{configuration("ip-preallocator-mutating-webhook-configuration", "ip-preallocator-system", time.Hour)}},
		{name: "not registered yet"},
		{name: "the first of two", configs: []client.Object{
			configuration("ip-preallocator-mutating-webhook-configuration", "ip-preallocator-system", time.Hour),
			configuration("second-mutating-webhook-configuration", "second", time.Minute),
		}},
		{name: "the second of two", configs: []client.Object{
			configuration("ip-preallocator-mutating-webhook-configuration", "ip-preallocator-system", time.Minute),
			configuration("first-mutating-webhook-configuration", "first", time.Hour),
		}, refused: "MutatingWebhookConfiguration first-mutating-webhook-configuration, registered first, calls its webhook in namespace first"},
		{name: "another, this one not registered yet", configs: []client.Object{
			configuration("first-mutating-webhook-configuration", "first", time.Hour),
		}, refused: "uninstall this one (namespace ip-preallocator-system)"},
		{name: "a webhook called by URL is no install", configs: []client.Object{url}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := fake.NewClientBuilder().WithScheme(fixtures.Scheme()).WithObjects(tc.configs...).Build()
			err := refuseSecondInstall(context.Background(), c, "ip-preallocator-system")
			if tc.refused == "" && err != nil || tc.refused != "" && (err == nil || !strings.Contains(err.Error(), tc.refused)) {
				t.Errorf("refuseSecondInstall() = %v, want refused with %q", err, tc.refused)
			}
		})
	}
}
