package memory

import (
	"testing"
	"time"
)

func TestExpiring(t *testing.T) {
	e := &Expiring[string, int]{TTL: 50 * time.Millisecond}
	e.Set("a", 1)
	if v, ok := e.Get("a"); !ok || v != 1 {
		t.Fatalf("Get(a) = %d, %v; want 1, true", v, ok)
	}
	if v := e.Update("a", func(v int, found bool) (int, bool) { return v + 1, found }); v != 2 {
		t.Fatalf("Update(a) = %d, want 2", v)
	}
	e.Update("b", func(int, bool) (int, bool) { return 0, false })
	if _, ok := e.Get("b"); ok {
		t.Fatal("Update that keeps nothing recorded b")
	}
	var seen []string
	e.Range(func(k string, _ int) { seen = append(seen, k) })
	if len(seen) != 1 || seen[0] != "a" {
		t.Fatalf("Range saw %v, want [a]", seen)
	}
	time.Sleep(60 * time.Millisecond)
	if _, ok := e.Get("a"); ok {
		t.Fatal("a is remembered past its TTL")
	}
	e.Set("c", 3)
	e.Delete("c")
	if _, ok := e.Get("c"); ok {
		t.Fatal("c is remembered after Delete")
	}
}
