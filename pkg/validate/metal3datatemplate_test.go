package validate

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"
	"sigs.k8s.io/controller-runtime/pkg/webhook/admission"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"

	"github.com/metal3-community/ip-preallocator/pkg/clock"
)

func mapper() meta.RESTMapper {
	m := meta.NewDefaultRESTMapper([]schema.GroupVersion{ipamv1.GroupVersion})
	m.Add(ipamv1.GroupVersion.WithKind("IPPool"), meta.RESTScopeNamespace)
	return m
}

func validator(objs ...client.Object) *Metal3DataTemplate {
	return &Metal3DataTemplate{
		Reader:     fake.NewClientBuilder().WithScheme(fixtures.Scheme()).WithObjects(objs...).Build(),
		RESTMapper: mapper(),
	}
}

// counting is a validator whose reads are counted, and fail when get says so.
func counting(reads *int, get func(context.Context) error) *Metal3DataTemplate {
	v := validator()
	v.Reader = fake.NewClientBuilder().WithScheme(fixtures.Scheme()).WithInterceptorFuncs(interceptor.Funcs{
		Get: func(ctx context.Context, c client.WithWatch, key client.ObjectKey, obj client.Object, opts ...client.GetOption) error {
			*reads++
			if err := get(ctx); err != nil {
				return err
			}
			return c.Get(ctx, key, obj, opts...)
		},
	}).Build()
	return v
}

func TestValidateWarnsAboutPoolsThatAreNotThere(t *testing.T) {
	tmpl := template("t", infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{
		{IPAddressFromIPPool: "present"},
		{IPAddressFromIPPool: "absent"},
		{FromPoolRef: infrav1.IPPoolReference{Name: "capi", APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool"}},
		{FromPoolAnnotation: infrav1.FromPoolAnnotation{Object: "machine", Annotation: "example.com/pool"}},
	}}, nil)
	present := &ipamv1.IPPool{ObjectMeta: metav1.ObjectMeta{Name: "present", Namespace: "ns"}}
	v := validator(present)
	before := template("t", infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{{IPAddressFromIPPool: "present"}}}, nil)

	for name, validate := range map[string]func() (admission.Warnings, error){
		"create": func() (admission.Warnings, error) { return v.ValidateCreate(context.Background(), tmpl) },
		"update that adds pools": func() (admission.Warnings, error) {
			return v.ValidateUpdate(context.Background(), before, tmpl)
		},
	} {
		t.Run(name, func(t *testing.T) {
			warnings, err := validate()
			if err != nil {
				t.Fatal(err)
			}
			want := []string{
				`spec.networkData.networks.ipv4[1].ipAddressFromIPPool: IPPool.ipam.metal3.io "absent" does not exist in namespace "ns"`,
				`spec.networkData.networks.ipv4[2].fromPoolRef: no installed API serves InClusterIPPool.ipam.cluster.x-k8s.io for pool "capi"`,
			}
			if diff := fixtures.Diff(want, []string(warnings)); diff != "" {
				t.Errorf("warnings (-want +got):\n%s", diff)
			}
		})
	}
}

// TestUpdateWithTheSamePoolsReadsNothing: the live checks only look at pools, so an update that
// keeps them, even moved to another field, does not wait for the API server.
func TestUpdateWithTheSamePoolsReadsNothing(t *testing.T) {
	old := template("t", infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{{ID: "a", IPAddressFromIPPool: "absent"}}}, nil)
	for name, tmpl := range map[string]*infrav1.Metal3DataTemplate{
		"metadata only": func() *infrav1.Metal3DataTemplate {
			tmpl := old.DeepCopy()
			tmpl.Finalizers = []string{"metal3datatemplate.infrastructure.cluster.x-k8s.io"}
			return tmpl
		}(),
		"another field":  template("t", infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{{ID: "b", IPAddressFromIPPool: "absent"}}}, nil),
		"the pool moved": template("t", infrav1.NetworkDataNetwork{IPv6: []infrav1.NetworkDataIPv6{{IPAddressFromIPPool: "absent"}}}, nil),
	} {
		t.Run(name, func(t *testing.T) {
			reads := 0
			v := counting(&reads, func(context.Context) error { return nil })
			warnings, err := v.ValidateUpdate(context.Background(), old, tmpl)
			if err != nil || warnings != nil || reads != 0 {
				t.Errorf("warnings %v, error %v, %d reads", warnings, err, reads)
			}
		})
	}
}

// TestLiveChecksHaveADeadline: the pool reads end well before the API server gives up on the
// webhook (timeoutSeconds 5), and a read that fails costs a warning, never the admission.
func TestLiveChecksHaveADeadline(t *testing.T) {
	reads := 0
	v := counting(&reads, func(ctx context.Context) error {
		deadline, ok := ctx.Deadline()
		if !ok || time.Until(deadline) > clock.ValidationLiveCheck {
			t.Errorf("read without a deadline within %s", clock.ValidationLiveCheck)
		}
		return context.DeadlineExceeded
	})
	tmpl := template("t", infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{{IPAddressFromIPPool: "p"}}}, nil)
	warnings, err := v.ValidateCreate(context.Background(), tmpl)
	if err != nil || warnings != nil || reads != 1 {
		t.Errorf("warnings %v, error %v, %d reads", warnings, err, reads)
	}
}

// blockingMapper is a RESTMapper whose discovery never answers.
type blockingMapper struct{ meta.RESTMapper }

func (blockingMapper) RESTMapping(schema.GroupKind, ...string) (*meta.RESTMapping, error) {
	select {}
}

func TestRESTMappingEndsAtTheDeadline(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Millisecond)
	defer cancel()
	if _, err := restMapping(ctx, blockingMapper{}, schema.GroupKind{Group: "g", Kind: "K"}); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("error %v", err)
	}
}

func TestValidateRejectsWithFieldPaths(t *testing.T) {
	tmpl := template("t", infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{
		{IPAddressFromIPPool: "p"}, {FromPoolRef: infrav1.IPPoolReference{Name: "p", Kind: "Other"}},
	}}, nil)
	_, err := validator().ValidateCreate(context.Background(), tmpl)
	if !apierrors.IsInvalid(err) {
		t.Fatalf("error %v is not Invalid", err)
	}
	status := err.(apierrors.APIStatus).Status()
	if status.Details.Kind != "Metal3DataTemplate" || status.Details.Group != "infrastructure.cluster.x-k8s.io" ||
		len(status.Details.Causes) != 1 || status.Details.Causes[0].Field != "spec.networkData.networks.ipv4[1].fromPoolRef" {
		t.Errorf("details %+v", status.Details)
	}
	if !strings.Contains(err.Error(), `Metal3DataTemplate.infrastructure.cluster.x-k8s.io "t" is invalid`) {
		t.Errorf("message %q", err.Error())
	}
}

// TestTemplate: what create and update reject, for a template stored before this validation
// (or before a rule changed) as much as for a new one.
func TestTemplate(t *testing.T) {
	const conflict = `spec.networkData.networks.ipv4[1].fromPoolRef: Invalid value: "p": pool "p" is referenced as ipam.metal3.io/Other here ` +
		`and as ipam.metal3.io/IPPool at spec.networkData.networks.ipv4[0].ipAddressFromIPPool; CAPM3 fails on one name with two resource types`
	const unknownObject = `spec.networkData.networks.ipv6[0].fromPoolAnnotation.object: Unsupported value: "cluster": supported values: "machine", "metal3machine", "baremetalhost"`
	invalid := template("t", infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{
		{IPAddressFromIPPool: "p"}, {FromPoolRef: infrav1.IPPoolReference{Name: "p", Kind: "Other"}},
	}}, nil)
	edited := func(tmpl *infrav1.Metal3DataTemplate, edit func(*infrav1.Metal3DataTemplate)) *infrav1.Metal3DataTemplate {
		tmpl = tmpl.DeepCopy()
		edit(tmpl)
		return tmpl
	}
	withUnknownObject := func(tmpl *infrav1.Metal3DataTemplate) {
		tmpl.Spec.NetworkData.Networks.IPv6 = []infrav1.NetworkDataIPv6{{FromPoolAnnotation: infrav1.FromPoolAnnotation{Object: "cluster", Annotation: "example.com/pool"}}}
	}
	deleting := func(tmpl *infrav1.Metal3DataTemplate) {
		tmpl.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		tmpl.Finalizers = []string{"metal3datatemplate.infrastructure.cluster.x-k8s.io"}
	}

	for _, tc := range []struct {
		name         string
		old, tmpl    *infrav1.Metal3DataTemplate
		wantErrs     []string
		wantWarnings []string
	}{
		{name: "create", tmpl: invalid, wantErrs: []string{conflict}},
		{
			name: "metadata-only update of a stored invalid template",
			old:  invalid,
			tmpl: edited(invalid, func(tmpl *infrav1.Metal3DataTemplate) {
				tmpl.Finalizers = nil
				tmpl.Labels = map[string]string{"cluster.x-k8s.io/cluster-name": "c"}
			}),
		},
		{
			name:         "spec update that keeps a stored error",
			old:          invalid,
			tmpl:         edited(invalid, func(tmpl *infrav1.Metal3DataTemplate) { tmpl.Spec.ClusterName = "other" }),
			wantWarnings: []string{conflict + " (admitted: the stored Metal3DataTemplate has it already, but CAPM3 still fails on it)"},
		},
		{
			name:         "spec update that introduces an error next to a stored one",
			old:          invalid,
			tmpl:         edited(invalid, withUnknownObject),
			wantErrs:     []string{unknownObject},
			wantWarnings: []string{conflict + " (admitted: the stored Metal3DataTemplate has it already, but CAPM3 still fails on it)"},
		},
		{
			name:     "spec update that makes a valid template invalid",
			old:      template("t", infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{{IPAddressFromIPPool: "p"}}}, nil),
			tmpl:     invalid,
			wantErrs: []string{conflict},
		},
		{
			name: "the same error at another field is new",
			old:  invalid,
			tmpl: template("t", infrav1.NetworkDataNetwork{IPv4: []infrav1.NetworkDataIPv4{
				{IPAddressFromIPPool: "p"}, {IPAddressFromIPPool: "q"}, {FromPoolRef: infrav1.IPPoolReference{Name: "p", Kind: "Other"}},
			}}, nil),
			wantErrs: []string{strings.Replace(conflict, "ipv4[1]", "ipv4[2]", 1)},
		},
		{
			name: "removing the finalizer of a template being deleted",
			old:  edited(invalid, deleting),
			tmpl: edited(edited(invalid, deleting), func(tmpl *infrav1.Metal3DataTemplate) { tmpl.Finalizers = nil }),
		},
		{
			name: "a spec update of a template being deleted",
			old:  edited(invalid, deleting),
			tmpl: edited(edited(invalid, deleting), withUnknownObject),
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			errs, warnings := Template(tc.old, tc.tmpl)
			expectVerdict(t, errs, warnings, tc.wantErrs, tc.wantWarnings)
		})
	}
}

func TestDeleteIsAlwaysAllowed(t *testing.T) {
	if w, err := validator().ValidateDelete(context.Background(), template("t", infrav1.NetworkDataNetwork{}, nil)); err != nil || w != nil {
		t.Fatal(w, err)
	}
}
