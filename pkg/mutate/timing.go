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

// WithRequestTiming is an admission.Webhook WithContextFunc: it notes when the API server's call
// arrived and the timeout the API server gave it, so that every step of the admission shares one
// deadline counted from the start of the request.
func WithRequestTiming(ctx context.Context, r *http.Request) context.Context {
	t := timing{start: time.Now()}
	if d, err := time.ParseDuration(r.URL.Query().Get("timeout")); err == nil && d > 0 {
		t.timeout = d
	}
	return context.WithValue(ctx, timingKey{}, t)
}

// requestTiming returns what WithRequestTiming noted, or now and no timeout.
func requestTiming(ctx context.Context) (time.Time, time.Duration) {
	if t, ok := ctx.Value(timingKey{}).(timing); ok {
		return t.start, t.timeout
	}
	return time.Now(), 0
}
