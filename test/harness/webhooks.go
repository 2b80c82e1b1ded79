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
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// UnregisterMutatingWebhooks deletes config/default's mutating webhook configurations, so that
// the API server does not call ip-preallocator at all (stock CAPM3).
func (cp *ControlPlane) UnregisterMutatingWebhooks(ctx context.Context) error {
	for _, hook := range cp.Env.WebhookInstallOptions.MutatingWebhooks {
		if err := cp.Client.Delete(ctx, hook.DeepCopy()); err != nil && !apierrors.IsNotFound(err) {
			return err
		}
	}
	return nil
}

// RegisterMutatingWebhooks installs config/default's mutating webhook configurations again.
func (cp *ControlPlane) RegisterMutatingWebhooks(ctx context.Context) error {
	for _, hook := range cp.Env.WebhookInstallOptions.MutatingWebhooks {
		hook := hook.DeepCopy()
		hook.ResourceVersion = ""
		if err := cp.Client.Create(ctx, hook); err != nil && !apierrors.IsAlreadyExists(err) {
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
