package mutate

import (
	"context"
	"encoding/json"
	"testing"

	jsonpatch "github.com/evanphx/json-patch/v5"
	admissionv1 "k8s.io/api/admission/v1"
	"k8s.io/apimachinery/pkg/runtime"

	"github.com/metal3-community/ip-preallocator/internal/fixtures"
	"github.com/metal3-community/ip-preallocator/pkg/allocation"
)

// FuzzRecordPatch: the record is added to any annotations without touching the others, and the
// patch applies to the object it was computed for.
func FuzzRecordPatch(f *testing.F) {
	f.Add(`{"metadata":{"name":"a"}}`, "IPClaim/a")
	f.Add(`{"metadata":{"annotations":{"x/y~z":"1"}}}`, "IPClaim/a,IPAddressClaim/b")
	f.Add(`{"metadata":{"annotations":{"ip-preallocator.metal3.io/claims":"old"}}}`, "")
	f.Add(`{}`, "0")
	f.Fuzz(func(t *testing.T, doc, value string) {
		var obj struct {
			Metadata *struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		}
		// Every object the API server sends has metadata.
		if err := json.Unmarshal([]byte(doc), &obj); err != nil || obj.Metadata == nil {
			return
		}
		record := map[string]string{allocation.ClaimsAnnotation: value, allocation.AdmissionAnnotation: "uid"}
		ops, err := json.Marshal(recordPatch(obj.Metadata.Annotations, record))
		if err != nil {
			t.Fatal(err)
		}
		patch, err := jsonpatch.DecodePatch(ops)
		if err != nil {
			t.Fatal(err)
		}
		patched, err := patch.Apply([]byte(doc))
		if err != nil {
			t.Fatalf("patch %s does not apply to %s: %v", ops, doc, err)
		}
		var out struct {
			Metadata struct {
				Annotations map[string]string `json:"annotations"`
			} `json:"metadata"`
		}
		if err := json.Unmarshal(patched, &out); err != nil {
			t.Fatal(err)
		}
		for k, v := range obj.Metadata.Annotations {
			if _, ours := record[k]; !ours && out.Metadata.Annotations[k] != v {
				t.Fatalf("annotation %q changed to %q", k, out.Metadata.Annotations[k])
			}
		}
		for k, v := range record {
			if out.Metadata.Annotations[k] != v {
				t.Fatalf("record %q = %q", k, out.Metadata.Annotations[k])
			}
		}
	})
}

// FuzzHandle: any object in a Metal3Data CREATE is admitted, never panics, and a patch is only
// ever the record.
func FuzzHandle(f *testing.F) {
	m := fixtures.NewMachine(fixtures.Template("tmpl"), 3)
	valid, err := json.Marshal(m.Data)
	if err != nil {
		f.Fatal(err)
	}
	f.Add(valid)
	f.Add([]byte(`{}`))
	f.Add([]byte(`{"metadata":{"name":"tmpl-3","annotations":{"ip-preallocator.metal3.io/claims":"IPClaim/x"}},"spec":{"template":{"name":"tmpl"}}}`))
	f.Add([]byte(`not json`))
	p := newPreallocator(fixtures.NewClient(fixtures.NewMachine(fixtures.Template("tmpl"), 3).Objects(), nil), false)
	f.Fuzz(func(t *testing.T, raw []byte) {
		req := fixtures.CreateRequest(t, m.Data, false)
		req.Object = runtime.RawExtension{Raw: raw}
		req.Operation = admissionv1.Create
		resp := p.Handle(context.Background(), req)
		if !resp.Allowed && resp.Result.Code != 400 {
			t.Fatalf("denied: %v", resp.Result)
		}
		for _, op := range resp.Patches {
			if op.Path != "/metadata/annotations" && op.Path != "/metadata/annotations/ip-preallocator.metal3.io~1claims" &&
				op.Path != "/metadata/annotations/ip-preallocator.metal3.io~1admission" {
				t.Fatalf("patch touches %s", op.Path)
			}
		}
	})
}
