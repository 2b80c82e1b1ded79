package main

import (
	"context"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"
)

// loadSampler records the machine's one-minute load average every few seconds: the benchmark
// shares its cores with whatever else runs, and its figures mean little without it.
type loadSampler struct {
	mu      sync.Mutex
	samples []loadSample
}

type loadSample struct {
	at   time.Time
	load float64
}

const loadInterval = 5 * time.Second

func startLoadSampler(ctx context.Context) *loadSampler {
	s := &loadSampler{}
	go func() {
		for {
			s.sample()
			select {
			case <-ctx.Done():
				return
			case <-time.After(loadInterval):
			}
		}
	}()
	return s
}

func (s *loadSampler) sample() {
	data, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return
	}
	fields := strings.Fields(string(data))
	if len(fields) == 0 {
		return
	}
	load, err := strconv.ParseFloat(fields[0], 64)
	if err != nil {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.samples = append(s.samples, loadSample{at: time.Now(), load: load})
}

// meanSince is the mean load of the samples taken since t, or the last sample before it.
func (s *loadSampler) meanSince(t time.Time) float64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	var sum float64
	var n int
	for _, x := range s.samples {
		if !x.at.Before(t) {
			sum += x.load
			n++
		}
	}
	if n == 0 && len(s.samples) > 0 {
		return s.samples[len(s.samples)-1].load
	}
	return sum / float64(max(n, 1))
}

// Load is the one-minute load average over the whole benchmark.
type Load struct {
	Min, Mean, Max float64
	Samples        int
}

func (s *loadSampler) summary() Load {
	s.mu.Lock()
	defer s.mu.Unlock()
	l := Load{Samples: len(s.samples)}
	for i, x := range s.samples {
		if i == 0 || x.load < l.Min {
			l.Min = x.load
		}
		l.Max = max(l.Max, x.load)
		l.Mean += x.load / float64(len(s.samples))
	}
	return l
}
