package mutate

import (
	"context"
	"net/http"
	"time"
)

type timingKey struct{}

type timing struct {
	start   time.Time
	timeout time.Duration
}

// WithRequestTiming is an admission.Webhook WithContextFunc noting when the call arrived and the API
// server's timeout for it, so the whole admission shares one deadline.
func WithRequestTiming(ctx context.Context, r *http.Request) context.Context {
	t := timing{start: time.Now()}
	if d, err := time.ParseDuration(r.URL.Query().Get("timeout")); err == nil && d > 0 {
		t.timeout = d
	}
	return context.WithValue(ctx, timingKey{}, t)
}

func requestTiming(ctx context.Context) (time.Time, time.Duration) {
	if t, ok := ctx.Value(timingKey{}).(timing); ok {
		return t.start, t.timeout
	}
	return time.Now(), 0
}
