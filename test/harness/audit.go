package harness

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"path/filepath"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	auditv1 "k8s.io/apiserver/pkg/apis/audit/v1"
)

const auditPolicy = `apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: ["RequestReceived"]
rules:
- level: Metadata
`

func (cp *ControlPlane) configureAudit() error {
	policy := filepath.Join(cp.Dir, "audit-policy.yaml")
	if err := os.WriteFile(policy, []byte(auditPolicy), 0o644); err != nil {
		return err
	}
	cp.Env.ControlPlane.GetAPIServer().Configure().
		Set("audit-policy-file", policy).
		Set("audit-log-path", cp.AuditLogPath()).
		Set("audit-log-format", "json").
		Set("audit-log-mode", "blocking").
		// Offsets into the file locate a run's events: no rotation (0 would mean 100 MB).
		Set("audit-log-maxsize", "1000000")
	return nil
}

// AuditLogPath is where kube-apiserver writes its audit log when Options.AuditLog is set.
func (cp *ControlPlane) AuditLogPath() string { return filepath.Join(cp.Dir, "audit.log") }

// AuditEvent is an event of the API server's audit log, as k8s.io/apiserver defines it. The
// policy logs at level Metadata: no request or response bodies. ObjectRef.Name is filled for a
// create too, from the request's object; StageTimestamp is when the response completed, so minus
// RequestReceivedTimestamp it is the time the API server took, admission webhooks included;
// Annotations include, for a create, one mutation.webhook.admission.k8s.io/ entry per mutating
// webhook that answered.
type AuditEvent = auditv1.Event

// AuditOffset is the current size of the audit log: events after it are read by AuditSince.
func (cp *ControlPlane) AuditOffset() (int64, error) {
	info, err := os.Stat(cp.AuditLogPath())
	if os.IsNotExist(err) {
		return 0, nil
	}
	if err != nil {
		return 0, err
	}
	return info.Size(), nil
}

// AuditSince returns the completed requests logged after offset (long-running watches count once,
// when they start). Every event has an ObjectRef and a ResponseStatus, empty where the log has
// none.
func (cp *ControlPlane) AuditSince(offset int64) ([]AuditEvent, error) {
	f, err := os.Open(cp.AuditLogPath())
	if err != nil {
		return nil, err
	}
	defer f.Close()
	if _, err := f.Seek(offset, io.SeekStart); err != nil {
		return nil, err
	}
	var events []AuditEvent
	scanner := bufio.NewScanner(f)
	scanner.Buffer(make([]byte, 1<<20), 1<<24)
	for scanner.Scan() {
		var e AuditEvent
		if err := json.Unmarshal(scanner.Bytes(), &e); err != nil {
			continue
		}
		if e.Stage != auditv1.StageResponseComplete && (e.Stage != auditv1.StageResponseStarted || e.Verb != "watch") {
			continue
		}
		// Requests for no object (discovery, /healthz) have no ObjectRef: empty ones spare the
		// readers a nil check, as does an empty ResponseStatus.
		if e.ObjectRef == nil {
			e.ObjectRef = &auditv1.ObjectReference{}
		}
		if e.ResponseStatus == nil {
			e.ResponseStatus = &metav1.Status{}
		}
		events = append(events, e)
	}
	return events, scanner.Err()
}
