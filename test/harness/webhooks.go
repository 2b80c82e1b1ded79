package harness

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"path/filepath"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// UnregisterMutatingWebhooks deletes config/default's mutating webhook configurations, so that
// the API server does not call ip-preallocator at all (stock CAPM3).
func (cp *ControlPlane) UnregisterMutatingWebhooks(ctx context.Context) error {
	return deleteAll(ctx, cp.Client, cp.Env.WebhookInstallOptions.MutatingWebhooks)
}

// RegisterMutatingWebhooks installs config/default's mutating webhook configurations again.
func (cp *ControlPlane) RegisterMutatingWebhooks(ctx context.Context) error {
	return createAll(ctx, cp.Client, cp.Env.WebhookInstallOptions.MutatingWebhooks)
}

// UnregisterValidatingWebhooks deletes config/default's validating webhook configurations, so
// that with the webhook process stopped the API server, as in a cluster without ip-preallocator,
// neither calls it nor refuses what it would have validated (failurePolicy: Fail).
func (cp *ControlPlane) UnregisterValidatingWebhooks(ctx context.Context) error {
	return deleteAll(ctx, cp.Client, cp.Env.WebhookInstallOptions.ValidatingWebhooks)
}

// RegisterValidatingWebhooks installs config/default's validating webhook configurations again.
func (cp *ControlPlane) RegisterValidatingWebhooks(ctx context.Context) error {
	return createAll(ctx, cp.Client, cp.Env.WebhookInstallOptions.ValidatingWebhooks)
}

func deleteAll[T client.Object](ctx context.Context, c client.Client, objs []T) error {
	for _, obj := range objs {
		if err := c.Delete(ctx, obj.DeepCopyObject().(client.Object)); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

func createAll[T client.Object](ctx context.Context, c client.Client, objs []T) error {
	for _, obj := range objs {
		obj := obj.DeepCopyObject().(client.Object)
		obj.SetResourceVersion("")
		if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}

// serveAdmission serves an admission handler over TLS on loopback with envtest's serving
// certificate, and returns its URL.
func (cp *ControlPlane) serveAdmission(ctx context.Context, handler admission.Handler) (string, error) {
	opts := cp.Env.WebhookInstallOptions
	cert, err := tls.LoadX509KeyPair(filepath.Join(opts.LocalServingCertDir, "tls.crt"), filepath.Join(opts.LocalServingCertDir, "tls.key"))
	if err != nil {
		return "", err
	}
	l, err := tls.Listen("tcp", "127.0.0.1:0", &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12})
	if err != nil {
		return "", err
	}
	srv := &http.Server{Handler: &admission.Webhook{Handler: handler}}
	go func() {
		if err := srv.Serve(l); err != nil && !errors.Is(err, http.ErrServerClosed) {
			fmt.Println("admission server:", err)
		}
	}()
	go func() {
		<-ctx.Done()
		_ = srv.Close()
	}()
	_, port, _ := net.SplitHostPort(l.Addr().String())
	return "https://127.0.0.1:" + port + "/", nil
}

// RegisterNoOpWebhook serves a mutating webhook that admits every Metal3Data unchanged, registered
// like ip-preallocator's (same rules, failure policy, side effects, timeout), to measure what any
// webhook costs an admission. The returned function unregisters it.
func (cp *ControlPlane) RegisterNoOpWebhook(ctx context.Context) (func(context.Context) error, error) {
	url, err := cp.serveAdmission(ctx, admission.HandlerFunc(func(context.Context, admission.Request) admission.Response {
		return admission.Allowed("")
	}))
	if err != nil {
		return nil, err
	}
	hook := cp.Env.WebhookInstallOptions.MutatingWebhooks[0].DeepCopy()
	hook.ObjectMeta = hookMeta("test-noop")
	for i := range hook.Webhooks {
		hook.Webhooks[i].Name = fmt.Sprintf("noop-%d.test.ip-preallocator.metal3.io", i)
		hook.Webhooks[i].ClientConfig = admissionv1.WebhookClientConfig{URL: ptr.To(url), CABundle: cp.Env.WebhookInstallOptions.LocalServingCAData}
	}
	if err := cp.Client.Create(ctx, hook); err != nil {
		return nil, err
	}
	return func(ctx context.Context) error { return cp.Client.Delete(ctx, hook) }, nil
}
