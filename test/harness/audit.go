package harness

import (
	"bufio"
	"encoding/json"
	"io"
	"os"
	"path/filepath"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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

// AuditEvent is what the benchmarks and the demo read of an audit event.
type AuditEvent struct {
	Verb      string `json:"verb"`
	Stage     string `json:"stage"`
	UserAgent string `json:"userAgent"`
	User      struct {
		Username string `json:"username"`
	} `json:"user"`
	ObjectRef struct {
		Resource    string `json:"resource"`
		Subresource string `json:"subresource"`
		Namespace   string `json:"namespace"`
		// Name is filled for a create too, from the request's object.
		Name string `json:"name"`
	} `json:"objectRef"`
	ResponseStatus struct {
		Code int `json:"code"`
	} `json:"responseStatus"`
	RequestReceivedTimestamp metav1.MicroTime `json:"requestReceivedTimestamp"`
	// StageTimestamp is when the response completed: minus RequestReceivedTimestamp, the time
	// the API server took, admission webhooks included.
	StageTimestamp metav1.MicroTime `json:"stageTimestamp"`
	// Annotations include, for a create, one mutation.webhook.admission.k8s.io/ entry per mutating
	// webhook that answered.
	Annotations map[string]string `json:"annotations"`
}

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
// when they start).
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
		if e.Stage == "ResponseComplete" || e.Stage == "ResponseStarted" && e.Verb == "watch" {
			events = append(events, e)
		}
	}
	return events, scanner.Err()
}
