// Package compat finds the CAPM3 the webhook runs beside and tells whether it creates the claims
// the webhook mirrors: a version whose rules pkg/allocation copies, naming claims the same way.
// With any other CAPM3, a preallocated claim is one CAPM3 never uses, and its address is held twice.
package compat

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/version"
	"k8s.io/klog/v2"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/pkg/allocation"
	"github.com/metal3-community/ip-preallocator/pkg/clock"
)

const (
	// ProviderLabel marks every object of a CAPM3 install, by clusterctl and by CAPM3's own
	// config/default alike.
	ProviderLabel = "cluster.x-k8s.io/provider"
	// ProviderLabelValue is ProviderLabel's value on CAPM3's objects.
	ProviderLabelValue = "infrastructure-metal3"
	// ProviderName is the name of CAPM3's clusterctl Provider.
	ProviderName = "metal3"

	bmhNameFlag = "enable-bmh-name-based-preallocation"
	qpsFlag     = "kube-api-qps"
)

// Found is what the guard found of the CAPM3 installs in the cluster.
type Found struct {
	// Providers are clusterctl's records of CAPM3, with the version it installed.
	Providers []clusterctlv1.Provider
	// Deployments are CAPM3's Deployments, whose manager container has the version as its image's
	// tag and the naming mode as a flag.
	Deployments []appsv1.Deployment
}

// Refusal says why the webhook must not preallocate; the zero Refusal lets it.
type Refusal struct {
	// Reason is CamelCase, for Events.
	Reason  string
	Message string
	// Subject, if set, is what was found that refuses.
	Subject client.Object
}

// Events' reasons.
const (
	ReasonNotFound           = "CAPM3NotFound"
	ReasonVersionNotMirrored = "CAPM3VersionNotMirrored"
	ReasonNamingDiffers      = "CAPM3NamingDiffers"
	ReasonLimitsRaised       = "CAPM3LimitsRaised"
)

// Check tells whether the webhook may preallocate beside what was found. version, when set, is the
// operator's word for CAPM3's version where it cannot be found; the naming mode is still read from
// every Deployment found.
func Check(f Found, version string, bmhNameBased bool) Refusal {
	type sourced struct {
		version, source string
		subject         client.Object
	}
	var versions []sourced
	switch {
	case version != "":
		versions = append(versions, sourced{version, "--capm3-version", nil})
	case len(f.Providers) > 0:
		for i := range f.Providers {
			p := &f.Providers[i]
			versions = append(versions, sourced{p.Version, "clusterctl Provider " + klog.KObj(p).String(), p})
		}
	default:
		for i := range f.Deployments {
			d := &f.Deployments[i]
			image := manager(*d).Image
			versions = append(versions, sourced{imageTag(image), fmt.Sprintf("image %s of Deployment %s", image, klog.KObj(d)), d})
		}
	}
	if len(versions) == 0 {
		return Refusal{Reason: ReasonNotFound, Message: fmt.Sprintf(
			"found no CAPM3: no clusterctl Provider %q and no Deployment labelled %s=%s; set --capm3-version where CAPM3 runs otherwise",
			ProviderName, ProviderLabel, ProviderLabelValue)}
	}
	for _, v := range versions {
		if !Mirrored(v.version) {
			return Refusal{Reason: ReasonVersionNotMirrored, Subject: v.subject, Message: fmt.Sprintf(
				"CAPM3 %q (%s) is not a version whose claims ip-preallocator mirrors: %s", v.version, v.source, MirroredVersions())}
		}
	}
	if len(f.Deployments) == 0 && version == "" {
		return Refusal{Reason: ReasonNotFound, Message: fmt.Sprintf(
			"found no CAPM3 Deployment labelled %s=%s to read --%s from", ProviderLabel, ProviderLabelValue, bmhNameFlag)}
	}
	for i := range f.Deployments {
		d := &f.Deployments[i]
		theirs, err := bmhNameBasedOf(manager(*d))
		if err != nil {
			return Refusal{Reason: ReasonNamingDiffers, Subject: d, Message: fmt.Sprintf("CAPM3 Deployment %s: %v", klog.KObj(d), err)}
		}
		if theirs != bmhNameBased {
			return Refusal{Reason: ReasonNamingDiffers, Subject: d, Message: fmt.Sprintf(
				"CAPM3 Deployment %s runs with --%s=%t and ip-preallocator with %t: CAPM3 names the claims it creates otherwise, and a preallocated claim stored after CAPM3's own holds a second address",
				klog.KObj(d), bmhNameFlag, theirs, bmhNameBased)}
		}
	}
	return Refusal{}
}

// LimitsRaised says which of CAPM3's Deployments runs its client above CAPM3's default rate
// limit, or "" if none does. There CAPM3 claims as soon as a Metal3Data is stored, and whatever an
// admission adds is paid once per machine in CAPM3's serial template loop: nothing is left to win.
func LimitsRaised(deployments []appsv1.Deployment) string {
	for i := range deployments {
		d := &deployments[i]
		qps, err := qpsOf(manager(*d))
		if err != nil {
			return fmt.Sprintf("CAPM3 Deployment %s: %v", klog.KObj(d), err)
		}
		if qps > clock.CAPM3DefaultQPS {
			return fmt.Sprintf("CAPM3 Deployment %s runs with --%s=%g, above its default %d: CAPM3 claims as soon as a Metal3Data is stored, and a preallocation would only slow its template loop",
				klog.KObj(d), qpsFlag, qps, clock.CAPM3DefaultQPS)
		}
	}
	return ""
}

// qpsOf reads the client rate limit flag as CAPM3's pflag does: "--flag=value" or "--flag value",
// the last occurrence wins, absent is the default.
func qpsOf(c corev1.Container) (float64, error) {
	qps := float64(clock.CAPM3DefaultQPS)
	args := slices.Concat(c.Command, c.Args)
	for i, arg := range args {
		name, value, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		if !strings.HasPrefix(arg, "-") || name != qpsFlag {
			continue
		}
		if !hasValue {
			if i+1 == len(args) {
				return 0, fmt.Errorf("%q has no value", arg)
			}
			value = args[i+1]
		}
		v, err := strconv.ParseFloat(value, 32)
		if err != nil {
			return 0, fmt.Errorf("cannot read %q as a number", value)
		}
		qps = v
	}
	return qps, nil
}

// Mirrored tells whether CAPM3 v creates the claims allocation mirrors: allocation.CAPM3Version and
// the later patch releases of its minor, which change no API.
func Mirrored(v string) bool {
	got, err := version.ParseSemantic(v)
	if err != nil {
		return false
	}
	mirrored := version.MustParseSemantic(allocation.CAPM3Version)
	return got.Major() == mirrored.Major() && got.Minor() == mirrored.Minor() && got.AtLeast(mirrored)
}

// MirroredVersions says which CAPM3 versions are Mirrored.
func MirroredVersions() string {
	v := version.MustParseSemantic(allocation.CAPM3Version)
	return fmt.Sprintf("%s and later v%d.%d patch releases", allocation.CAPM3Version, v.Major(), v.Minor())
}

// manager is CAPM3's manager container, named so in its Deployment.
func manager(d appsv1.Deployment) corev1.Container {
	containers := d.Spec.Template.Spec.Containers
	for _, c := range containers {
		if c.Name == "manager" {
			return c
		}
	}
	if len(containers) == 0 {
		return corev1.Container{}
	}
	return containers[0]
}

// imageTag is the tag of an image reference: empty for a digest alone or no tag.
func imageTag(image string) string {
	image, _, _ = strings.Cut(image, "@")
	if i := strings.LastIndex(image, ":"); i > strings.LastIndex(image, "/") {
		return image[i+1:]
	}
	return ""
}

// bmhNameBasedOf reads the naming flag as CAPM3's pflag does: the last occurrence wins, absent is false.
func bmhNameBasedOf(c corev1.Container) (bool, error) {
	on := false
	for _, arg := range slices.Concat(c.Command, c.Args) {
		name, value, hasValue := strings.Cut(strings.TrimLeft(arg, "-"), "=")
		if !strings.HasPrefix(arg, "-") || name != bmhNameFlag {
			continue
		}
		if !hasValue {
			on = true
			continue
		}
		b, err := strconv.ParseBool(value)
		if err != nil {
			return false, fmt.Errorf("cannot read %q as a boolean", arg)
		}
		on = b
	}
	return on, nil
}
