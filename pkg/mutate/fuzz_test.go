package mutate

import (
	"context"
	"encoding/json"
	"testing"
	"unicode/utf8"

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
	f.Add(`{"metadata":{"annotations":null}}`, "0")
	f.Add(`{"metAdAtA":{}}`, "0")
	f.Fuzz(func(t *testing.T, doc, value string) {
		// Every object the API server sends has metadata; record values are object names.
		before, ok := annotationsOf([]byte(doc))
		if !ok || !utf8.ValidString(value) {
			return
		}
		record := map[string]string{allocation.ClaimsAnnotation: value, allocation.AdmissionAnnotation: "uid"}
		ops, err := json.Marshal(recordPatch(before, record))
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
		after, ok := annotationsOf(patched)
		if !ok {
			t.Fatalf("patched object %s has no metadata", patched)
		}
		for k, v := range before {
			if _, ours := record[k]; !ours && after[k] != v {
				t.Fatalf("annotation %q changed to %q", k, after[k])
			}
		}
		for k, v := range record {
			if after[k] != v {
				t.Fatalf("record %q = %q", k, after[k])
			}
		}
	})
}

// annotationsOf reads metadata.annotations with exact keys, as JSON patch paths match them (Go's
// JSON decoding into structs would match keys case-insensitively).
func annotationsOf(doc []byte) (map[string]string, bool) {
	var top, metadata map[string]json.RawMessage
	if json.Unmarshal(doc, &top) != nil || json.Unmarshal(top["metadata"], &metadata) != nil || metadata == nil {
		return nil, false
	}
	var annotations map[string]string
	if raw, ok := metadata["annotations"]; ok && json.Unmarshal(raw, &annotations) != nil {
		return nil, false
	}
	return annotations, true
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
