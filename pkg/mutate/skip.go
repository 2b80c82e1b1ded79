package mutate

import (
	"fmt"
)

// Reasons for admitting a Metal3Data without preallocating; they are metric label values.
const (
	ReasonDryRun            = "DryRun"
	ReasonAlreadyRendered   = "AlreadyRendered"
	ReasonPaused            = "Paused"
	ReasonNoName            = "NoName"
	ReasonNoTemplate        = "NoTemplate"
	ReasonTemplateNotFound  = "TemplateNotFound"
	ReasonClusterNotFound   = "ClusterNotFound"
	ReasonTemplateMismatch  = "TemplateOfOtherCluster"
	ReasonNoPools           = "NoPools"
	ReasonInvalidName       = "InvalidName"
	ReasonObjectMissing     = "ObjectMissing"
	ReasonInvalidReferences = "InvalidPoolReferences"
	ReasonReadFailed        = "ReadFailed"
	ReasonRequester         = "RequesterNotAllowed"
	ReasonRecordTooLarge    = "RecordTooLarge"
	ReasonNameInUse         = "NameInUse"
	ReasonOutOfScope        = "OutOfScope"
	ReasonIncompatibleCAPM3 = "IncompatibleCAPM3"
)

// WebhookName is the preallocating webhook's name in its MutatingWebhookConfiguration.
const WebhookName = "preallocate.metal3data.ip-preallocator.metal3.io"

// +kubebuilder:webhook:path=/mutate-infrastructure-cluster-x-k8s-io-v1beta2-metal3data-preallocate,mutating=true,failurePolicy=ignore,sideEffects=NoneOnDryRun,groups=infrastructure.cluster.x-k8s.io,resources=metal3datas,verbs=create,versions=v1beta2,name=preallocate.metal3data.ip-preallocator.metal3.io,matchPolicy=Equivalent,reinvocationPolicy=Never,timeoutSeconds=5,admissionReviewVersions=v1

// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=metal3datatemplates;metal3machines,verbs=get;list;watch
// +kubebuilder:rbac:groups=infrastructure.cluster.x-k8s.io,resources=metal3dataclaims,verbs=get;list;watch
// +kubebuilder:rbac:groups=cluster.x-k8s.io,resources=clusters;machines,verbs=get;list;watch
// +kubebuilder:rbac:groups=metal3.io,resources=baremetalhosts,verbs=get;list;watch
// +kubebuilder:rbac:groups=ipam.metal3.io,resources=ipclaims,verbs=get;list;watch;create
// +kubebuilder:rbac:groups=ipam.cluster.x-k8s.io,resources=ipaddressclaims,verbs=get;list;watch;create

type skip struct {
	reason string
	msg    string
}

func (s *skip) Error() string { return s.reason + ": " + s.msg }

func skipf(reason, format string, args ...any) *skip {
	return &skip{reason: reason, msg: fmt.Sprintf(format, args...)}
}
