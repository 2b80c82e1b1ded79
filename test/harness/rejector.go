package harness

import (
	"context"
	"encoding/json"
	"net/http"

	admissionv1 "k8s.io/api/admissionregistration/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"
)

// RejectLabel marks a Metal3Data that the harness's validating webhook rejects, as a later
// admission step would: ours has already run and preallocated, and the object is never stored.
const RejectLabel = "test.ip-preallocator.metal3.io/reject"

// InstallRejector serves a validating webhook for Metal3Data CREATE that rejects objects carrying
// RejectLabel, with the serving certificate envtest made for the webhook.
func (cp *ControlPlane) InstallRejector(ctx context.Context) error {
	url, err := cp.serveAdmission(ctx, admission.HandlerFunc(func(_ context.Context, req admission.Request) admission.Response {
		obj := &metav1.PartialObjectMetadata{}
		if err := json.Unmarshal(req.Object.Raw, obj); err != nil {
			return admission.Errored(http.StatusBadRequest, err)
		}
		if _, ok := obj.Labels[RejectLabel]; ok {
			return admission.Denied("rejected by the test's validating webhook")
		}
		return admission.Allowed("")
	}))
	if err != nil {
		return err
	}
	none := admissionv1.SideEffectClassNone
	fail := admissionv1.Fail
	return cp.Client.Create(ctx, &admissionv1.ValidatingWebhookConfiguration{
		ObjectMeta: hookMeta("test-rejector"),
		Webhooks: []admissionv1.ValidatingWebhook{{
			Name: "reject.metal3data.test.ip-preallocator.metal3.io",
			ClientConfig: admissionv1.WebhookClientConfig{
				URL:      ptr.To(url),
				CABundle: cp.Env.WebhookInstallOptions.LocalServingCAData,
			},
			Rules: []admissionv1.RuleWithOperations{{
				Operations: []admissionv1.OperationType{admissionv1.Create},
				Rule: admissionv1.Rule{
					APIGroups: []string{"infrastructure.cluster.x-k8s.io"}, APIVersions: []string{"*"}, Resources: []string{"metal3datas"},
				},
			}},
			SideEffects:             &none,
			FailurePolicy:           &fail,
			AdmissionReviewVersions: []string{"v1"},
		}},
	})
}

func hookMeta(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name} }
