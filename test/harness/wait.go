package harness

import (
	"context"
	"fmt"
	"time"

	"k8s.io/apimachinery/pkg/util/wait"
)

// poll calls check at once, then every interval, until it returns nil. When timeout passes or ctx
// ends first, the error is the context's with check's last error.
func poll(ctx context.Context, interval, timeout time.Duration, check func() error) error {
	var last error
	err := wait.PollUntilContextTimeout(ctx, interval, timeout, true, func(context.Context) (bool, error) {
		last = check()
		return last == nil, nil
	})
	if err != nil && last != nil {
		return fmt.Errorf("%w: %w", err, last)
	}
	return err
}

// waitFor polls check every 50 ms, for the processes the harness starts.
func waitFor(ctx context.Context, timeout time.Duration, check func() error) error {
	return poll(ctx, 50*time.Millisecond, timeout, check)
}

// TB is what Eventually needs of a test (testing.TB has it).
type TB interface {
	Helper()
	Fatalf(format string, args ...any)
}

// Eventually calls check at once, then every 100 ms, until it returns nil, and fails t with
// check's last error when timeout passes first.
func Eventually(t TB, timeout time.Duration, check func() error) {
	t.Helper()
	if err := poll(context.Background(), 100*time.Millisecond, timeout, check); err != nil {
		t.Fatalf("after %v: %v", timeout, err)
	}
}
