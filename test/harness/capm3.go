package harness

import (
	"context"
	"fmt"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

const (
	// CAPM3Namespace is the namespace of CAPM3's Deployment, which stands for CAPM3 as clusterctl
	// installs it. Nothing runs it (CAPM3's controllers run in-process, test/stack): the webhook's
	// compatibility guard reads its image's tag and its naming flag.
	CAPM3Namespace = "capm3-system"
	// CAPM3Deployment is its name.
	CAPM3Deployment = "capm3-controller-manager"
	// WebhookPod is the name StartWebhook's process has as its pod's (POD_NAME).
	WebhookPod = "ip-preallocator-webhook"
	// CAPM3Image is the image of the CAPM3 whose controllers the tests run.
	CAPM3Image = "quay.io/metal3-io/cluster-api-provider-metal3:v1.13.2"
)

// CAPM3DeploymentObject is CAPM3's Deployment as clusterctl renders it, in the naming mode given,
// with args added to its manager's (its client limits, say).
func CAPM3DeploymentObject(image string, bmhNameBased bool, args ...string) *appsv1.Deployment {
	labels := map[string]string{"cluster.x-k8s.io/provider": "infrastructure-metal3", "control-plane": "controller-manager"}
	return &appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: CAPM3Namespace, Name: CAPM3Deployment, Labels: labels},
		Spec: appsv1.DeploymentSpec{
			Selector: &metav1.LabelSelector{MatchLabels: labels},
			Template: corev1.PodTemplateSpec{
				ObjectMeta: metav1.ObjectMeta{Labels: labels},
				Spec: corev1.PodSpec{Containers: []corev1.Container{{
					Name: "manager", Image: image, Command: []string{"/manager"},
					Args: append([]string{"--webhook-port=9443", "--enable-bmh-name-based-preallocation=" + strconv.FormatBool(bmhNameBased)}, args...),
				}}},
			},
		},
	}
}

// DeclareCAPM3 creates or replaces CAPM3's Deployment, its manager run with args added.
func (cp *ControlPlane) DeclareCAPM3(ctx context.Context, image string, bmhNameBased bool, args ...string) error {
	if err := cp.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: CAPM3Namespace}}); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", CAPM3Namespace, err)
	}
	want := CAPM3DeploymentObject(image, bmhNameBased, args...)
	existing := &appsv1.Deployment{}
	switch err := cp.Client.Get(ctx, client.ObjectKeyFromObject(want), existing); {
	case apierrors.IsNotFound(err):
		err = cp.Client.Create(ctx, want)
		if err != nil {
			return fmt.Errorf("creating CAPM3's Deployment: %w", err)
		}
		return nil
	case err != nil:
		return err
	}
	existing.Labels, existing.Spec = want.Labels, want.Spec
	if err := cp.Client.Update(ctx, existing); err != nil {
		return fmt.Errorf("updating CAPM3's Deployment: %w", err)
	}
	return nil
}

// SetCAPM3Args declares CAPM3's Deployment run with args added, now and whenever a webhook starts:
// what CAPM3 in-process runs with that the webhook reads from there (its client limits).
func (cp *ControlPlane) SetCAPM3Args(ctx context.Context, args ...string) error {
	cp.capm3Args = args
	return cp.DeclareCAPM3(ctx, CAPM3Image, cp.bmhNameBased, args...)
}

// bmhNameBasedIn reads the webhook's naming flag from its args: the last occurrence wins.
func bmhNameBasedIn(args []string) bool {
	on := false
	for _, a := range args {
		if v, ok := strings.CutPrefix(a, "--enable-bmh-name-based-preallocation"); ok {
			on = v == "" || v == "=true"
		}
	}
	return on
}

// RouteWebhook makes the webhook processes StartWebhook starts reach the API server through the
// kubeconfig at path (a proxy's, made from WebhookKubeconfig), until restore.
func (cp *ControlPlane) RouteWebhook(path string) (restore func()) {
	old := cp.webhookKubeconfig
	cp.webhookKubeconfig = path
	return func() { cp.webhookKubeconfig = old }
}
