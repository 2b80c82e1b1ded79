package compat

import (
	"strings"
	"testing"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
)

func deployment(image string, args ...string) appsv1.Deployment {
	return appsv1.Deployment{
		ObjectMeta: metav1.ObjectMeta{Namespace: "capm3-system", Name: "capm3-controller-manager"},
		Spec: appsv1.DeploymentSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{Containers: []corev1.Container{
			{Name: "kube-rbac-proxy", Image: "quay.io/brancz/kube-rbac-proxy:v0.18.0"},
			{Name: "manager", Image: image, Command: []string{"/manager"}, Args: args},
		}}}},
	}
}

func provider(v string) clusterctlv1.Provider {
	return clusterctlv1.Provider{
		ObjectMeta:   metav1.ObjectMeta{Namespace: "capm3-system", Name: "infrastructure-metal3"},
		ProviderName: ProviderName, Type: string(clusterctlv1.InfrastructureProviderType), Version: v,
	}
}

func TestCheck(t *testing.T) {
	const image = "quay.io/metal3-io/cluster-api-provider-metal3:"
	for _, tc := range []struct {
		name    string
		found   Found
		version string
		bmh     bool
		// refusal is a part of the refusal; empty: preallocate.
		refusal string
	}{
		{name: "deployment of the mirrored version", found: Found{Deployments: []appsv1.Deployment{
			deployment(image+"v1.13.2", "--webhook-port=9443", "--enable-bmh-name-based-preallocation=false")}}},
		{name: "a later patch release", found: Found{Deployments: []appsv1.Deployment{deployment(image + "v1.13.5")}}},
		{name: "the tag with a digest", found: Found{Deployments: []appsv1.Deployment{deployment(image + "v1.13.2@sha256:0123")}}},
		{name: "an earlier patch release", found: Found{Deployments: []appsv1.Deployment{deployment(image + "v1.13.1")}},
			refusal: `CAPM3 "v1.13.1" (image ` + image + "v1.13.1 of Deployment capm3-system/capm3-controller-manager) is not a version"},
		{name: "the next minor", found: Found{Deployments: []appsv1.Deployment{deployment(image + "v1.14.0-rc.0")}}, refusal: `CAPM3 "v1.14.0-rc.0"`},
		{name: "the older API", found: Found{Deployments: []appsv1.Deployment{deployment(image + "v1.12.3")}}, refusal: `CAPM3 "v1.12.3"`},
		{name: "a branch tag", found: Found{Deployments: []appsv1.Deployment{deployment(image + "main")}}, refusal: `CAPM3 "main"`},
		{name: "a digest alone", found: Found{Deployments: []appsv1.Deployment{deployment("registry:5000/capm3@sha256:0123")}}, refusal: `CAPM3 ""`},
		{name: "the Provider's version wins over the tag", found: Found{
			Providers:   []clusterctlv1.Provider{provider("v1.13.2")},
			Deployments: []appsv1.Deployment{deployment("registry:5000/capm3@sha256:0123")}}},
		{name: "a Provider of another version", found: Found{
			Providers:   []clusterctlv1.Provider{provider("v1.14.0")},
			Deployments: []appsv1.Deployment{deployment(image + "v1.13.2")}},
			refusal: `CAPM3 "v1.14.0" (clusterctl Provider capm3-system/infrastructure-metal3)`},
		{name: "a Provider without a Deployment", found: Found{Providers: []clusterctlv1.Provider{provider("v1.13.2")}},
			refusal: "found no CAPM3 Deployment labelled cluster.x-k8s.io/provider=infrastructure-metal3 to read --enable-bmh-name-based-preallocation"},
		{name: "nothing found", refusal: "found no CAPM3: no clusterctl Provider"},
		{name: "nothing found, the operator's version", version: "v1.13.2", bmh: true},
		{name: "the operator's version is checked too", version: "v1.14.0", refusal: `CAPM3 "v1.14.0" (--capm3-version)`},
		{name: "the operator's version, another naming mode found", version: "v1.13.2", bmh: true,
			found:   Found{Deployments: []appsv1.Deployment{deployment(image + "main")}},
			refusal: "runs with --enable-bmh-name-based-preallocation=false and ip-preallocator with true"},
		{name: "CAPM3 names claims after hosts", found: Found{Deployments: []appsv1.Deployment{
			deployment(image+"v1.13.2", "--enable-bmh-name-based-preallocation=true")}},
			refusal: "runs with --enable-bmh-name-based-preallocation=true and ip-preallocator with false: CAPM3 names the claims it creates otherwise"},
		{name: "both name claims after hosts", bmh: true, found: Found{Deployments: []appsv1.Deployment{
			deployment(image+"v1.13.2", "--enable-bmh-name-based-preallocation")}}},
		{name: "the last occurrence wins", found: Found{Deployments: []appsv1.Deployment{
			deployment(image+"v1.13.2", "--enable-bmh-name-based-preallocation=true", "-enable-bmh-name-based-preallocation=false")}}},
		{name: "a flag clusterctl did not substitute", found: Found{Deployments: []appsv1.Deployment{
			deployment(image+"v1.13.2", "--enable-bmh-name-based-preallocation=${ENABLE_BMH_NAME_BASED_PREALLOCATION:=false}")}},
			refusal: `cannot read "--enable-bmh-name-based-preallocation=${ENABLE_BMH_NAME_BASED_PREALLOCATION:=false}" as a boolean`},
		{name: "any of two installs differs", found: Found{Deployments: []appsv1.Deployment{
			deployment(image + "v1.13.2"), deployment(image+"v1.13.2", "--enable-bmh-name-based-preallocation=true")}},
			refusal: "--enable-bmh-name-based-preallocation=true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := Check(tc.found, tc.version, tc.bmh).Message
			if tc.refusal == "" && got != "" || !strings.Contains(got, tc.refusal) {
				t.Errorf("Check() = %q, want one containing %q", got, tc.refusal)
			}
			if tc.refusal != "" && got == "" {
				t.Errorf("Check() preallocates, want a refusal containing %q", tc.refusal)
			}
		})
	}
}

func TestLimitsRaised(t *testing.T) {
	const image = "quay.io/metal3-io/cluster-api-provider-metal3:v1.13.2"
	for _, tc := range []struct {
		name string
		args []string
		// raised is a part of the verdict; empty: CAPM3 runs at its default limit.
		raised string
	}{
		{name: "the default", args: []string{"--webhook-port=9443"}},
		{name: "the default, written out", args: []string{"--kube-api-qps=20", "--kube-api-burst=30"}},
		{name: "a lower limit", args: []string{"--kube-api-qps=5"}},
		{name: "raised", args: []string{"--kube-api-qps=100"}, raised: "capm3-system/capm3-controller-manager runs with --kube-api-qps=100, above its default 20"},
		{name: "raised, value as the next argument", args: []string{"--kube-api-qps", "50.5"}, raised: "--kube-api-qps=50.5"},
		{name: "the last occurrence wins", args: []string{"--kube-api-qps=100", "--kube-api-qps=20"}},
		{name: "only the burst raised", args: []string{"--kube-api-burst=1000"}},
		{name: "a flag clusterctl did not substitute", args: []string{"--kube-api-qps=${CAPM3_KUBE_API_QPS:=20}"},
			raised: `cannot read "${CAPM3_KUBE_API_QPS:=20}" as a number`},
		{name: "no value", args: []string{"--kube-api-qps"}, raised: `"--kube-api-qps" has no value`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := LimitsRaised([]appsv1.Deployment{deployment(image), deployment(image, tc.args...)})
			if tc.raised == "" && got != "" || !strings.Contains(got, tc.raised) {
				t.Errorf("LimitsRaised() = %q, want one containing %q", got, tc.raised)
			}
			if tc.raised != "" && got == "" {
				t.Errorf("LimitsRaised() = \"\", want one containing %q", tc.raised)
			}
		})
	}
}
