package harness

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"
)

// endpointSliceManager marks the EndpointSlices RunDeployment writes.
const endpointSliceManager = "harness.ip-preallocator.metal3.io"

// RunOptions say what RunDeployment cannot read from the Deployment.
type RunOptions struct {
	// Binaries maps a container image to the binary that stands for it, e.g. one built with
	// make build VERSION=<the image's tag>.
	Binaries map[string]string
	// ExtraArgs are appended to the container's args: what the pod's environment would provide
	// (--leader-election-namespace stands in for the service account's namespace file) and what
	// a test shortens (--release-grace-period).
	ExtraArgs []string
	// ImageArgs are appended after ExtraArgs for the pods of one image.
	ImageArgs map[string][]string
	// SecretSyncDelay is how long a changed Secret takes to reach the files of a volume. The
	// kubelet takes up to its sync period plus its cache's TTL (about a minute by default); a
	// test that shows what happens meanwhile sets a few seconds.
	SecretSyncDelay time.Duration
}

// Deployment is a Deployment of an applied manifest, run by RunDeployment.
type Deployment struct {
	cp        *ControlPlane
	namespace string
	name      string
	opts      RunOptions

	cancel context.CancelFunc
	done   chan struct{}

	mu      sync.Mutex
	current *Pod // ready and published, or the only one
	next    *Pod // started for a changed template, not ready yet
	started int
	events  []string
	err     error
}

// Pod is one process standing for a pod of the Deployment.
type Pod struct {
	Name  string
	Image string
	// Binary is the binary that stands for Image.
	Binary string
	// Addrs maps each container port name to the loopback address the process listens on.
	Addrs   map[string]string
	LogPath string

	proc     *Process
	template string
	// Ready is set once its readiness probe passed.
	ready   bool
	stopped chan struct{}
	stop    func()
}

// Pid is the process id.
func (p *Pod) Pid() int { return p.proc.Pid() }

// Running tells whether the process has not exited.
func (p *Pod) Running() bool { return p.proc.Running() }

// RunDeployment plays, for one Deployment of an applied manifest, the parts of a cluster the test
// control plane lacks: the ReplicaSet controller (a pod from the template, checked by a server
// dry run so that Pod Security admission judges it), the kubelet (the container's binary run as
// the pod's service account, its Secret volumes projected into directories and updated as the
// kubelet does, the readiness probe) and the EndpointSlice controller (a ready pod published to
// every Service that selects it, FQDN 127.0.0.1: EndpointSlice IP addresses may not be
// loopback). One process stands for all replicas. A changed pod template starts a new process
// and stops the old one once the new one is ready, as a rolling update with surge does; a
// deleted Deployment stops it, as the garbage collector and the kubelet would.
//
// The container's args are kept and rewritten only where the cluster and the loopback differ:
// each container port's flag (the arg whose value is the port, or ends with :port) gets a free
// loopback port, and each arg naming a volume mount path gets the projected directory. A
// container port no arg sets, a Service port that targets no container port, or a volume mount
// no arg names is an error: a manifest a cluster would run, wrong.
func (cp *ControlPlane) RunDeployment(ctx context.Context, namespace, name string, opts RunOptions) *Deployment {
	ctx, cancel := context.WithCancel(ctx)
	d := &Deployment{cp: cp, namespace: namespace, name: name, opts: opts, cancel: cancel, done: make(chan struct{})}
	go d.loop(ctx)
	return d
}

// Stop stops its processes and the loop.
func (d *Deployment) Stop() {
	d.cancel()
	<-d.done
}

// Current is the pod serving, or nil.
func (d *Deployment) Current() *Pod {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.current
}

// Err is the last error that keeps the Deployment from running as it should.
func (d *Deployment) Err() error {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.err
}

// Events is what happened to the Deployment's pods, in order.
func (d *Deployment) Events() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return slices.Clone(d.events)
}

func (d *Deployment) eventf(format string, args ...any) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.events = append(d.events, time.Now().Format("15:04:05.000")+" "+fmt.Sprintf(format, args...))
}

func (d *Deployment) setErr(err error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	d.err = err
}

// WaitReady waits until a pod of the current template serves.
func (d *Deployment) WaitReady(ctx context.Context, timeout time.Duration) (*Pod, error) {
	var pod *Pod
	err := waitFor(ctx, timeout, func() error {
		d.mu.Lock()
		defer d.mu.Unlock()
		if d.current != nil && d.current.ready && d.next == nil {
			pod = d.current
			return nil
		}
		if d.err != nil {
			return d.err
		}
		return errors.New("no ready pod yet")
	})
	return pod, err
}

func (d *Deployment) loop(ctx context.Context) {
	defer close(d.done)
	defer func() {
		d.mu.Lock()
		pods := []*Pod{d.current, d.next}
		d.current, d.next = nil, nil
		d.mu.Unlock()
		for _, p := range pods {
			if p != nil {
				p.stop()
			}
		}
	}()
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		if err := d.sync(ctx); err != nil && ctx.Err() == nil {
			d.setErr(err)
		}
	}, 200*time.Millisecond)
}

// sync moves the pods one step towards the Deployment.
func (d *Deployment) sync(ctx context.Context) error {
	dep := &appsv1.Deployment{}
	err := d.cp.Client.Get(ctx, types.NamespacedName{Namespace: d.namespace, Name: d.name}, dep)
	if apierrors.IsNotFound(err) || err == nil && dep.DeletionTimestamp != nil {
		d.mu.Lock()
		pods := []*Pod{d.current, d.next}
		d.current, d.next = nil, nil
		d.mu.Unlock()
		for _, p := range pods {
			if p != nil {
				d.eventf("deployment deleted: stopping %s", p.Name)
				p.stop()
			}
		}
		return nil
	}
	if err != nil {
		return err
	}
	tmpl, err := json.Marshal(dep.Spec.Template)
	if err != nil {
		return err
	}

	d.mu.Lock()
	current, next := d.current, d.next
	d.mu.Unlock()

	// Restart a crashed process, as the kubelet does (restartPolicy Always).
	for _, p := range []*Pod{current, next} {
		if p == nil || p.Running() {
			continue
		}
		d.eventf("%s exited: restarting", p.Name)
		p.stop()
		d.mu.Lock()
		if d.current == p {
			d.current = nil
		}
		if d.next == p {
			d.next = nil
		}
		d.mu.Unlock()
	}
	d.mu.Lock()
	current, next = d.current, d.next
	d.mu.Unlock()

	if next != nil && next.template != string(tmpl) {
		d.eventf("template changed again: stopping %s", next.Name)
		next.stop()
		next = nil
		d.mu.Lock()
		d.next = nil
		d.mu.Unlock()
	}
	if next == nil && (current == nil || current.template != string(tmpl)) {
		pod, err := d.startPod(ctx, dep, string(tmpl))
		if err != nil || pod == nil {
			return err
		}
		next = pod
		d.mu.Lock()
		d.next = pod
		d.mu.Unlock()
	}
	if next != nil {
		ready, err := probe(dep, next)
		if err != nil {
			return err
		}
		if !ready {
			return nil
		}
		next.ready = true
		if err := d.publish(ctx, dep, next); err != nil {
			return err
		}
		d.eventf("%s ready and published", next.Name)
		d.mu.Lock()
		d.current, d.next = next, nil
		d.err = nil
		d.mu.Unlock()
		if current != nil {
			d.eventf("stopping %s", current.Name)
			current.stop()
		}
	}
	return nil
}

// startPod creates the pod's process, or returns nil while a Secret it mounts does not exist
// (the kubelet leaves it in ContainerCreating).
func (d *Deployment) startPod(ctx context.Context, dep *appsv1.Deployment, tmpl string) (*Pod, error) {
	spec := dep.Spec.Template.Spec
	if len(spec.Containers) != 1 {
		return nil, fmt.Errorf("deployment %s has %d containers; the harness runs one", d.name, len(spec.Containers))
	}
	// The ReplicaSet controller's create, judged by admission (Pod Security) but not stored.
	dryRun := &corev1.Pod{
		ObjectMeta: metav1.ObjectMeta{
			GenerateName: d.name + "-", Namespace: d.namespace,
			Labels: dep.Spec.Template.Labels, Annotations: dep.Spec.Template.Annotations,
		},
		Spec: *spec.DeepCopy(),
	}
	if err := d.cp.Client.Create(ctx, dryRun, client.DryRunAll); err != nil {
		return nil, fmt.Errorf("the pod of deployment %s is not admitted: %w", d.name, err)
	}

	c := spec.Containers[0]
	bin, ok := d.opts.Binaries[c.Image]
	if !ok {
		return nil, fmt.Errorf("no binary stands for image %q", c.Image)
	}
	secrets := map[string]*corev1.Secret{} // by mount path
	for _, m := range c.VolumeMounts {
		secret := &corev1.Secret{}
		for _, v := range spec.Volumes {
			if v.Name == m.Name && v.Secret != nil {
				secret.Name = v.Secret.SecretName
			}
		}
		if secret.Name == "" {
			return nil, fmt.Errorf("volume %s: the harness projects Secret volumes only", m.Name)
		}
		err := d.cp.Client.Get(ctx, types.NamespacedName{Namespace: d.namespace, Name: secret.Name}, secret)
		if apierrors.IsNotFound(err) {
			return nil, nil
		}
		if err != nil {
			return nil, err
		}
		secrets[m.MountPath] = secret
	}
	d.mu.Lock()
	d.started++
	podName := fmt.Sprintf("%s-%d", d.name, d.started)
	d.mu.Unlock()

	// Secret volumes, projected before the container starts and kept up to date.
	ctx, cancel := context.WithCancel(ctx)
	var projections sync.WaitGroup
	mounts := map[string]string{}
	for path, secret := range secrets {
		dir := filepath.Join(d.cp.Dir, "pods", podName, "volumes", filepath.Base(path))
		if err := writeAtomically(dir, secret.Data); err != nil {
			cancel()
			return nil, err
		}
		mounts[path] = dir
		projections.Add(1)
		go func() {
			defer projections.Done()
			d.cp.projectSecret(ctx, d.namespace, secret.Name, dir, secret.ResourceVersion, d.opts.SecretSyncDelay)
		}()
	}
	stopProjections := func() {
		cancel()
		projections.Wait()
	}

	args, addrs, err := podArgs(c, mounts)
	if err != nil {
		stopProjections()
		return nil, err
	}
	args = append(args, d.opts.ExtraArgs...)
	args = append(args, d.opts.ImageArgs[c.Image]...)
	kubeconfig, err := d.cp.ServiceAccountKubeconfig(d.namespace, spec.ServiceAccountName)
	if err != nil {
		stopProjections()
		return nil, err
	}
	logPath := filepath.Join(d.cp.Dir, podName+".log")
	// The image's entrypoint is the binary; a command, if any, replaces it.
	if len(c.Command) > 0 {
		args = append(slices.Clone(c.Command[1:]), args...)
	}
	env, err := podEnv(c, d.namespace, podName)
	if err != nil {
		stopProjections()
		return nil, err
	}
	proc, err := StartProcess(ctx, logPath, bin, append(env, "KUBECONFIG="+kubeconfig), args...)
	if err != nil {
		stopProjections()
		return nil, err
	}
	pod := &Pod{Name: podName, Image: c.Image, Binary: bin, Addrs: addrs, LogPath: logPath, proc: proc, template: tmpl, stopped: make(chan struct{})}
	var once sync.Once
	pod.stop = func() {
		once.Do(func() {
			proc.Stop()
			stopProjections()
			close(pod.stopped)
		})
	}
	d.eventf("%s started: %s %s", podName, c.Image, strings.Join(args, " "))
	return pod, nil
}

// podEnv is the container's environment as the kubelet sets it: values, and the pod's namespace
// and name from the downward API.
func podEnv(c corev1.Container, namespace, podName string) ([]string, error) {
	var env []string
	for _, e := range c.Env {
		value := e.Value
		if from := e.ValueFrom; from != nil {
			switch {
			case from.FieldRef != nil && from.FieldRef.FieldPath == "metadata.namespace":
				value = namespace
			case from.FieldRef != nil && from.FieldRef.FieldPath == "metadata.name":
				value = podName
			default:
				return nil, fmt.Errorf("env %s: the harness sets values and the pod's namespace and name only", e.Name)
			}
		}
		env = append(env, e.Name+"="+value)
	}
	return env, nil
}

// podArgs rewrites the container's args for loopback: a free port for each container port and
// the projected directory for each volume mount.
func podArgs(c corev1.Container, mounts map[string]string) ([]string, map[string]string, error) {
	args := slices.Clone(c.Args)
	addrs := map[string]string{}
	for _, p := range c.Ports {
		addr, err := FreeAddr()
		if err != nil {
			return nil, nil, err
		}
		_, port, _ := net.SplitHostPort(addr)
		want := strconv.Itoa(int(p.ContainerPort))
		set := false
		for i, a := range args {
			flag, value, ok := strings.Cut(a, "=")
			if !ok || !strings.HasPrefix(flag, "--") {
				continue
			}
			switch {
			case value == want:
				args[i] = flag + "=" + port
			case strings.HasSuffix(value, ":"+want):
				args[i] = flag + "=" + addr
			default:
				continue
			}
			set = true
		}
		if !set {
			return nil, nil, fmt.Errorf("container port %s (%s) is set by no flag in %v", p.Name, want, c.Args)
		}
		addrs[p.Name] = addr
	}
	for path, dir := range mounts {
		used := false
		for i, a := range args {
			if flag, value, ok := strings.Cut(a, "="); ok && (value == path || strings.HasPrefix(value, path+"/")) {
				args[i] = flag + "=" + dir + strings.TrimPrefix(value, path)
				used = true
			}
		}
		if !used {
			return nil, nil, fmt.Errorf("volume mount %s is passed to no flag in %v", path, c.Args)
		}
	}
	return args, addrs, nil
}

var readinessClient = &http.Client{Timeout: time.Second}

// probe runs the container's readiness probe once.
func probe(dep *appsv1.Deployment, pod *Pod) (bool, error) {
	rp := dep.Spec.Template.Spec.Containers[0].ReadinessProbe
	if rp == nil || rp.HTTPGet == nil {
		return pod.Running(), nil
	}
	addr, err := portAddr(dep.Spec.Template.Spec.Containers[0], pod, rp.HTTPGet.Port.String())
	if err != nil {
		return false, fmt.Errorf("readiness probe: %w", err)
	}
	return healthy(readinessClient, "http://"+addr+rp.HTTPGet.Path) == nil, nil
}

// portAddr resolves a port by name or number to where the pod's process listens.
func portAddr(c corev1.Container, pod *Pod, port string) (string, error) {
	for _, p := range c.Ports {
		if p.Name == port || strconv.Itoa(int(p.ContainerPort)) == port {
			return pod.Addrs[p.Name], nil
		}
	}
	return "", fmt.Errorf("port %s is no container port", port)
}

// publish makes the pod the one endpoint of every Service of the namespace that selects it.
func (d *Deployment) publish(ctx context.Context, dep *appsv1.Deployment, pod *Pod) error {
	services := &corev1.ServiceList{}
	if err := d.cp.Client.List(ctx, services, client.InNamespace(d.namespace)); err != nil {
		return err
	}
	c := dep.Spec.Template.Spec.Containers[0]
	for _, svc := range services.Items {
		if len(svc.Spec.Selector) == 0 || !labels.SelectorFromSet(svc.Spec.Selector).Matches(labels.Set(dep.Spec.Template.Labels)) {
			continue
		}
		slice := &discoveryv1.EndpointSlice{
			ObjectMeta: metav1.ObjectMeta{
				Name: svc.Name + "-harness", Namespace: d.namespace,
				Labels: map[string]string{
					discoveryv1.LabelServiceName: svc.Name,
					discoveryv1.LabelManagedBy:   endpointSliceManager,
				},
			},
			AddressType: discoveryv1.AddressTypeFQDN,
			Endpoints: []discoveryv1.Endpoint{{
				Addresses:  []string{"127.0.0.1"},
				Conditions: discoveryv1.EndpointConditions{Ready: ptr.To(true)},
				TargetRef:  &corev1.ObjectReference{Kind: "Pod", Namespace: d.namespace, Name: pod.Name},
			}},
		}
		for _, sp := range svc.Spec.Ports {
			addr, err := portAddr(c, pod, sp.TargetPort.String())
			if err != nil {
				return fmt.Errorf("service %s port %d: target %w", svc.Name, sp.Port, err)
			}
			_, port, _ := net.SplitHostPort(addr)
			n, _ := strconv.Atoi(port)
			slice.Ports = append(slice.Ports, discoveryv1.EndpointPort{
				Name: ptr.To(sp.Name), Port: ptr.To(int32(n)), Protocol: ptr.To(sp.Protocol),
			})
		}
		existing := &discoveryv1.EndpointSlice{}
		err := d.cp.Client.Get(ctx, client.ObjectKeyFromObject(slice), existing)
		switch {
		case apierrors.IsNotFound(err):
			err = d.cp.Client.Create(ctx, slice)
		case err == nil:
			existing.Endpoints, existing.Ports = slice.Endpoints, slice.Ports
			err = d.cp.Client.Update(ctx, existing)
		}
		if err != nil {
			return fmt.Errorf("endpoints of service %s: %w", svc.Name, err)
		}
	}
	return nil
}

// projectSecret keeps dir up to date with a Secret, from version on, as the kubelet updates a
// secret volume, until ctx ends: a change reaches the files delay after it is seen.
func (cp *ControlPlane) projectSecret(ctx context.Context, namespace, name, dir, version string, delay time.Duration) {
	var changed time.Time // when a version other than the projected one was first seen
	wait.UntilWithContext(ctx, func(ctx context.Context) {
		secret := &corev1.Secret{}
		if err := cp.Client.Get(ctx, types.NamespacedName{Namespace: namespace, Name: name}, secret); err != nil {
			return // a deleted Secret leaves the files in place, as with the kubelet
		}
		if secret.ResourceVersion == version {
			return
		}
		if changed.IsZero() {
			changed = time.Now()
		}
		if time.Since(changed) < delay {
			return
		}
		if err := writeAtomically(dir, secret.Data); err == nil {
			version, changed = secret.ResourceVersion, time.Time{}
		}
	}, 100*time.Millisecond)
}

// writeAtomically lays files out as the kubelet's atomic writer does: the data in a new
// timestamped directory, the ..data symlink swapped to it with a rename, one symlink per key into
// ..data, the previous directory removed. A reader never sees a certificate of one version with
// a key of another.
func writeAtomically(dir string, data map[string][]byte) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return err
	}
	ts, err := os.MkdirTemp(dir, time.Now().UTC().Format("..2006_01_02_15_04_05."))
	if err != nil {
		return err
	}
	for _, key := range slices.Sorted(maps.Keys(data)) {
		if err := os.WriteFile(filepath.Join(ts, key), data[key], 0o644); err != nil {
			return err
		}
	}
	dataLink, tmpLink := filepath.Join(dir, "..data"), filepath.Join(dir, "..data_tmp")
	old, _ := os.Readlink(dataLink)
	_ = os.Remove(tmpLink)
	if err := os.Symlink(filepath.Base(ts), tmpLink); err != nil {
		return err
	}
	if err := os.Rename(tmpLink, dataLink); err != nil {
		return err
	}
	for key := range data {
		link := filepath.Join(dir, key)
		if _, err := os.Lstat(link); errors.Is(err, os.ErrNotExist) {
			if err := os.Symlink(filepath.Join("..data", key), link); err != nil {
				return err
			}
		}
	}
	if old != "" {
		return os.RemoveAll(filepath.Join(dir, old))
	}
	return nil
}

// ServiceAccountKubeconfig returns a kubeconfig that authenticates as a service account (its
// user name and groups), written once per service account.
func (cp *ControlPlane) ServiceAccountKubeconfig(namespace, name string) (string, error) {
	path := filepath.Join(cp.Dir, "sa-"+namespace+"-"+name+".kubeconfig")
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	user, err := cp.Env.ControlPlane.AddUser(envtest.User{
		Name:   "system:serviceaccount:" + namespace + ":" + name,
		Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
	}, nil)
	if err != nil {
		return "", err
	}
	data, err := user.KubeConfig()
	if err != nil {
		return "", err
	}
	return cp.writeKubeconfig(filepath.Base(path), data)
}
