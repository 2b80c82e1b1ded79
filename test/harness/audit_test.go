package harness

import (
	"os"
	"strings"
	"testing"
	"time"
)

// TestAuditSince decodes audit log lines as kube-apiserver writes them (level Metadata, JSON),
// from an offset on: completed requests and started watches, each with an ObjectRef and a
// ResponseStatus.
func TestAuditSince(t *testing.T) {
	cp := &ControlPlane{Dir: t.TempDir()}
	before := `{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","stage":"ResponseComplete","requestURI":"/api","verb":"get","user":{"username":"admin"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-11-30T12:54:20.000000Z","stageTimestamp":"2026-11-30T12:54:20.001000Z"}` + "\n"
	if err := os.WriteFile(cp.AuditLogPath(), []byte(before), 0o644); err != nil {
		t.Fatal(err)
	}
	offset, err := cp.AuditOffset()
	if err != nil || offset != int64(len(before)) {
		t.Fatalf("offset %d, %v; want %d", offset, err, len(before))
	}
	lines := []string{
		`{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"1","stage":"ResponseComplete","requestURI":"/apis/infrastructure.cluster.x-k8s.io/v1beta2/namespaces/ns/metal3datas","verb":"create","user":{"username":"system:serviceaccount:capm3-system:capm3-manager","groups":["system:authenticated"]},"sourceIPs":["127.0.0.1"],"userAgent":"capm3/v1.13.2","objectRef":{"resource":"metal3datas","namespace":"ns","name":"workers-0","apiGroup":"infrastructure.cluster.x-k8s.io","apiVersion":"v1beta2"},"responseStatus":{"metadata":{},"code":201},"requestReceivedTimestamp":"2026-11-30T12:54:26.943155Z","stageTimestamp":"2026-11-30T12:54:26.962278Z","annotations":{"mutation.webhook.admission.k8s.io/round_0_index_0":"{\"configuration\":\"ip-preallocator\",\"webhook\":\"ip-preallocator.metal3.io\",\"mutated\":true}"}}`,
		`{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"2","stage":"ResponseComplete","requestURI":"/apis","verb":"get","user":{"username":"admin"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-11-30T12:54:27.000000Z","stageTimestamp":"2026-11-30T12:54:27.001000Z"}`,
		`{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"3","stage":"ResponseStarted","requestURI":"/api/v1/secrets?watch=true","verb":"watch","user":{"username":"admin"},"objectRef":{"resource":"secrets","apiVersion":"v1"},"responseStatus":{"metadata":{},"code":200},"requestReceivedTimestamp":"2026-11-30T12:54:28.000000Z","stageTimestamp":"2026-11-30T12:54:28.001000Z"}`,
		`{"kind":"Event","apiVersion":"audit.k8s.io/v1","level":"Metadata","auditID":"4","stage":"ResponseStarted","requestURI":"/api/v1/pods","verb":"list","user":{"username":"admin"},"objectRef":{"resource":"pods","apiVersion":"v1"},"requestReceivedTimestamp":"2026-11-30T12:54:29.000000Z","stageTimestamp":"2026-11-30T12:54:29.001000Z"}`,
		`not an event`,
	}
	f, err := os.OpenFile(cp.AuditLogPath(), os.O_APPEND|os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := f.WriteString(strings.Join(lines, "\n") + "\n"); err != nil {
		t.Fatal(err)
	}
	if err := f.Close(); err != nil {
		t.Fatal(err)
	}

	events, err := cp.AuditSince(offset)
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range events {
		ids = append(ids, string(e.AuditID))
		if e.ObjectRef == nil || e.ResponseStatus == nil {
			t.Errorf("event %s: ObjectRef %v, ResponseStatus %v", e.AuditID, e.ObjectRef, e.ResponseStatus)
		}
	}
	if strings.Join(ids, ",") != "1,2,3" {
		t.Fatalf("events %v, want 1,2,3", ids)
	}
	create := events[0]
	if create.Verb != "create" || create.UserAgent != "capm3/v1.13.2" ||
		create.User.Username != "system:serviceaccount:capm3-system:capm3-manager" ||
		create.ObjectRef.Resource != "metal3datas" || create.ObjectRef.Subresource != "" ||
		create.ObjectRef.Namespace != "ns" || create.ObjectRef.Name != "workers-0" ||
		create.ResponseStatus.Code != 201 {
		t.Errorf("create decoded as %+v", create)
	}
	if took := create.StageTimestamp.Sub(create.RequestReceivedTimestamp.Time); took != 19123*time.Microsecond {
		t.Errorf("create took %v, want 19.123ms", took)
	}
	if !strings.Contains(create.Annotations["mutation.webhook.admission.k8s.io/round_0_index_0"], "ip-preallocator.metal3.io") {
		t.Errorf("annotations %v", create.Annotations)
	}
	if events[1].ObjectRef.Resource != "" || events[1].ResponseStatus.Code != 200 {
		t.Errorf("discovery request decoded as %+v", events[1])
	}
}
