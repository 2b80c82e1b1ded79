package faults

import (
	"context"
	"slices"
	"strconv"
	"time"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
)

// The suite stands in for CAPM3's Metal3DataTemplate controller where deletion needs it, and only
// there (the suite creates Metal3Data itself, to control names and timing):
//   - a Metal3Data carries that controller's finalizer, which it removes once the Metal3DataClaim
//     is gone; CAPM3's Metal3Data controller releases the claims only after that.
//   - the template carries that controller's finalizer while Metal3Data of it exist; CAPM3 needs
//     the template to find the claims it releases, so a namespace deletion must not remove it
//     first.

// finalizerPatch removes finalizer i while it is still there (a JSON patch test guards it).
func finalizerPatch(i int, name string) client.Patch {
	return client.RawPatch(types.JSONPatchType, []byte(
		`[{"op":"test","path":"/metadata/finalizers/`+strconv.Itoa(i)+`","value":"`+name+`"},{"op":"remove","path":"/metadata/finalizers/`+strconv.Itoa(i)+`"}]`))
}

type dataFinalizerStandIn struct {
	c    client.Client
	live client.Reader
}

func (s *dataFinalizerStandIn) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	data := &infrav1.Metal3Data{}
	if err := s.c.Get(ctx, req.NamespacedName, data); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	i := slices.Index(data.Finalizers, infrav1.DataClaimFinalizer)
	if data.DeletionTimestamp.IsZero() || i < 0 {
		return ctrl.Result{}, nil
	}
	if data.Spec.Claim != nil {
		claim := &infrav1.Metal3DataClaim{}
		err := s.live.Get(ctx, types.NamespacedName{Namespace: data.Namespace, Name: data.Spec.Claim.Name}, claim)
		if err == nil && claim.UID == ownerUID(data, "Metal3DataClaim") {
			return ctrl.Result{RequeueAfter: 200 * time.Millisecond}, nil
		}
		if err != nil && !apierrors.IsNotFound(err) {
			return ctrl.Result{}, err
		}
	}
	err := s.c.Patch(ctx, data, finalizerPatch(i, infrav1.DataClaimFinalizer))
	if apierrors.IsNotFound(err) || apierrors.IsInvalid(err) {
		return ctrl.Result{}, nil
	}
	return ctrl.Result{}, err
}

type templateFinalizerStandIn struct{ c client.Client }

func (s *templateFinalizerStandIn) Reconcile(ctx context.Context, req ctrl.Request) (ctrl.Result, error) {
	tmpl := &infrav1.Metal3DataTemplate{}
	if err := s.c.Get(ctx, req.NamespacedName, tmpl); err != nil {
		return ctrl.Result{}, client.IgnoreNotFound(err)
	}
	i := slices.Index(tmpl.Finalizers, infrav1.DataTemplateFinalizer)
	if tmpl.DeletionTimestamp.IsZero() || i < 0 {
		return ctrl.Result{}, nil
	}
	datas := &infrav1.Metal3DataList{}
	if err := s.c.List(ctx, datas, client.InNamespace(tmpl.Namespace)); err != nil {
		return ctrl.Result{}, err
	}
	for _, d := range datas.Items {
		if d.Spec.Template != nil && d.Spec.Template.Name == tmpl.Name {
			return ctrl.Result{RequeueAfter: 200 * time.Millisecond}, nil
		}
	}
	err := s.c.Patch(ctx, tmpl, finalizerPatch(i, infrav1.DataTemplateFinalizer))
	if apierrors.IsNotFound(err) || apierrors.IsInvalid(err) {
		return ctrl.Result{}, nil
	}
	return ctrl.Result{}, err
}

func startTemplateStandIn(ctx context.Context, cfg *rest.Config) error {
	cfg = rest.CopyConfig(cfg)
	cfg.UserAgent = "metal3datatemplate-stand-in"
	mgr, err := ctrl.NewManager(cfg, ctrl.Options{
		Scheme:                 fixtures.Scheme(),
		Metrics:                metricsserver.Options{BindAddress: "0"},
		HealthProbeBindAddress: "0",
	})
	if err != nil {
		return err
	}
	// As many workers as CAPM3's Metal3Data controller, so that the stand-in does not pace a
	// namespace deletion.
	opts := controller.Options{MaxConcurrentReconciles: 10, SkipNameValidation: ptr.To(true)}
	if err := ctrl.NewControllerManagedBy(mgr).Named("stand-in-metal3data").For(&infrav1.Metal3Data{}).WithOptions(opts).
		Complete(&dataFinalizerStandIn{c: mgr.GetClient(), live: mgr.GetAPIReader()}); err != nil {
		return err
	}
	if err := ctrl.NewControllerManagedBy(mgr).Named("stand-in-metal3datatemplate").For(&infrav1.Metal3DataTemplate{}).WithOptions(opts).
		Complete(&templateFinalizerStandIn{c: mgr.GetClient()}); err != nil {
		return err
	}
	go func() { _ = mgr.Start(ctx) }()
	return nil
}
