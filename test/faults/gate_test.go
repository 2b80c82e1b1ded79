package faults

import (
	"context"
	"encoding/json"
	"fmt"
	"strings"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	admissionregistrationv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// The admission gate is a ValidatingAdmissionPolicy that rejects the Metal3Data whose names are
// keys of the ConfigMap gateConfigMap in their namespace: it runs after every mutating webhook,
// so ours has preallocated for a Metal3Data that is then never stored, as with any later
// validating webhook, policy or quota. Taking a name out of the ConfigMap lets the next attempt
// through, as when whatever rejected it is fixed and the creator retries.
const (
	gatePolicy    = "fault-suite-gate"
	gateConfigMap = "fault-gate"
	gateMessage   = "rejected by the fault suite's admission gate"
)

// stockLabel marks the namespaces of a baseline trial: our mutating webhook is not called there
// (excludeStockNamespaces), so CAPM3 and the IPAMs run as without it.
const stockLabel = "faults.ip-preallocator.metal3.io/stock"

func installGate(ctx context.Context) error {
	policy := &admissionregistrationv1.ValidatingAdmissionPolicy{
		ObjectMeta: metav1.ObjectMeta{Name: gatePolicy},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicySpec{
			FailurePolicy: ptr.To(admissionregistrationv1.Fail),
			ParamKind:     &admissionregistrationv1.ParamKind{APIVersion: "v1", Kind: "ConfigMap"},
			MatchConstraints: &admissionregistrationv1.MatchResources{
				ResourceRules: []admissionregistrationv1.NamedRuleWithOperations{{
					RuleWithOperations: admissionregistrationv1.RuleWithOperations{
						Operations: []admissionregistrationv1.OperationType{admissionregistrationv1.Create},
						Rule: admissionregistrationv1.Rule{
							APIGroups: []string{infrav1.GroupVersion.Group}, APIVersions: []string{"*"}, Resources: []string{"metal3datas"},
						},
					},
				}},
			},
			Validations: []admissionregistrationv1.Validation{{
				Expression: "!has(params.data) || !(object.metadata.name in params.data)",
				Message:    gateMessage,
				Reason:     ptr.To(metav1.StatusReasonForbidden),
			}},
		},
	}
	binding := &admissionregistrationv1.ValidatingAdmissionPolicyBinding{
		ObjectMeta: metav1.ObjectMeta{Name: gatePolicy},
		Spec: admissionregistrationv1.ValidatingAdmissionPolicyBindingSpec{
			PolicyName: gatePolicy,
			// Without a namespace, the parameter is read from the admitted object's namespace.
			ParamRef: &admissionregistrationv1.ParamRef{
				Name: gateConfigMap, ParameterNotFoundAction: ptr.To(admissionregistrationv1.AllowAction),
			},
			ValidationActions: []admissionregistrationv1.ValidationAction{admissionregistrationv1.Deny},
			MatchResources: &admissionregistrationv1.MatchResources{
				NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{gateLabel: "true"}},
			},
		},
	}
	for _, obj := range []client.Object{policy, binding} {
		if err := cp.Client.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
	}
	return nil
}

// closeGate makes the gate reject these names in ns, and waits until the API server enforces it
// (a dry run, which our webhook skips, of the first name is rejected).
func closeGate(ctx context.Context, ns string, datas []*infrav1.Metal3Data) error {
	if len(datas) == 0 {
		return nil
	}
	data := map[string]string{}
	for _, d := range datas {
		data[d.Name] = ""
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: gateConfigMap}, Data: data}
	if err := cp.Client.Create(ctx, cm); apierrors.IsAlreadyExists(err) {
		patch, err := json.Marshal(map[string]any{"data": data})
		if err != nil {
			return err
		}
		err = cp.Client.Patch(ctx, cm, client.RawPatch(types.MergePatchType, patch))
		if err != nil {
			return err
		}
	} else if err != nil {
		return err
	}
	probe := datas[0].DeepCopy()
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := cp.Client.Create(ctx, probe.DeepCopy(), client.DryRunAll)
		if err != nil && strings.Contains(err.Error(), gateMessage) {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("the admission gate does not reject %s/%s: %v", ns, probe.Name, err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}

// openGate lets name through from now on (the policy's parameter informer follows within
// milliseconds; an attempt before that is rejected once more and retried).
func openGate(ctx context.Context, ns, name string) error {
	patch, err := json.Marshal(map[string]any{"data": map[string]any{name: nil}})
	if err != nil {
		return err
	}
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: gateConfigMap}}
	return cp.Client.Patch(ctx, cm, client.RawPatch(types.MergePatchType, patch))
}

func gateRejected(err error) bool { return err != nil && strings.Contains(err.Error(), gateMessage) }
