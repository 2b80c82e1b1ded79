package mutate

import (
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

func TestDeletionsForgetAfterWindow(t *testing.T) {
	d := NewDeletions(50 * time.Millisecond)
	key := types.NamespacedName{Namespace: "ns", Name: "tmpl-0"}
	if _, ok := d.Since(key); ok {
		t.Fatal("a name never deleted is reported")
	}
	d.OnDelete(&metav1.PartialObjectMetadata{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "tmpl-0"}})
	if _, ok := d.Since(key); !ok {
		t.Fatal("a deletion within the window is not reported")
	}
	if _, ok := d.Since(types.NamespacedName{Namespace: "other", Name: "tmpl-0"}); ok {
		t.Fatal("the name in another namespace is reported")
	}
	time.Sleep(60 * time.Millisecond)
	if _, ok := d.Since(key); ok {
		t.Fatal("a deletion older than the window is reported")
	}
}
