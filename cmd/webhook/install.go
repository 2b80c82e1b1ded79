package main

import (
	"context"
	"fmt"

	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	"k8s.io/klog/v2"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/pkg/mutate"
)

// +kubebuilder:rbac:groups=admissionregistration.k8s.io,resources=mutatingwebhookconfigurations,verbs=get;list

// refuseSecondInstall fails when another install's preallocating webhook, registered before this
// install's, calls a service outside this pod's namespace: the webhooks of both would preallocate
// every Metal3Data, each in turn. The install first registered keeps running.
func refuseSecondInstall(ctx context.Context, r client.Reader, namespace string) error {
	if namespace == "" {
		return nil
	}
	configs := &admissionregistrationv1.MutatingWebhookConfigurationList{}
	if err := r.List(ctx, configs); err != nil {
		return fmt.Errorf("listing MutatingWebhookConfigurations to find another install: %w", err)
	}
	// The first registered of this install's configurations, and of the others'.
	var ours, other *admissionregistrationv1.MutatingWebhookConfiguration
	otherNamespace := ""
	for i := range configs.Items {
		c := &configs.Items[i]
		for _, w := range c.Webhooks {
			if w.Name != mutate.WebhookName || w.ClientConfig.Service == nil {
				continue
			}
			switch ns := w.ClientConfig.Service.Namespace; {
			case ns == namespace:
				ours = earlier(ours, c)
			case earlier(other, c) == c:
				other, otherNamespace = c, ns
			}
		}
	}
	if other == nil || ours != nil && earlier(ours, other) == ours {
		return nil
	}
	return fmt.Errorf("another ip-preallocator install serves this cluster: MutatingWebhookConfiguration %s, registered first, calls its webhook in namespace %s; "+
		"with two, both webhooks would preallocate every Metal3Data: uninstall this one (namespace %s) or that one",
		klog.KObj(other), otherNamespace, namespace)
}

// earlier is the configuration registered first, by name within a second; b when there is no a.
func earlier(a, b *admissionregistrationv1.MutatingWebhookConfiguration) *admissionregistrationv1.MutatingWebhookConfiguration {
	if a == nil || b.CreationTimestamp.Before(&a.CreationTimestamp) || b.CreationTimestamp.Equal(&a.CreationTimestamp) && b.Name < a.Name {
		return b
	}
	return a
}
