// Package clock holds every delay, poll and limit of the webhook, with why each has its value.
// Defaults are what the flags of the same meaning start from.
package clock

import "time"

// Admission.
const (
	// AdmissionTimeout: an admission that takes longer costs CAPM3's serial template loop more than
	// its claims win; the webhook configuration's own 5 s bounds it too.
	AdmissionTimeout = 3 * time.Second
	// APIServerShare: of the API server's timeout for the call, the share the admission may use,
	// leaving the rest for the answer to travel back.
	APIServerShare = 0.8
	// CreatesOnWire: how long an admission waits for its claims' creates to be sent; they then
	// reach the API server before the Metal3Data, which is stored only after the answer.
	CreatesOnWire = 50 * time.Millisecond
	// ClaimCreation bounds the creation of one admission's claims, retries included.
	ClaimCreation = 10 * time.Second
	// IdleAnswerWait: an idle admission (alone in its namespace, every claim of its replica
	// answered) waits this long for the IPAM's answers, which then wake no CAPM3 reconcile.
	IdleAnswerWait = time.Second
	// IdleAnswerPoll: how often that wait reads the cache; the IPAM answers in tens of milliseconds.
	IdleAnswerPoll = 5 * time.Millisecond
	// ReusedNameHoldoff: CAPM3 releases by name from a cache that can lag a deletion by seconds.
	ReusedNameHoldoff = 10 * time.Second
	// CreatedQueue: created admissions waiting for the hand-over's queue; a burst of CAPM3's
	// template loop stays far below it.
	CreatedQueue = 1024
	// CAPM3DefaultQPS is CAPM3's default --kube-api-qps, above which admissions are left to CAPM3.
	// At it, CAPM3's reconciles wait on their client limit, and the claims' work done meanwhile
	// pays; at the raised limit make bench measures, CAPM3 claims as soon as a Metal3Data is stored
	// and every preallocation is paid in its serial template loop.
	CAPM3DefaultQPS = 20
)

// Creates of claims are retried within the admission's creation timeout.
const (
	CreateRetryFirst = 50 * time.Millisecond
	CreateRetryCap   = 2 * time.Second
	CreateRetries    = 8
)

// The IPAM's lag.
const (
	// IPAMBehind: well above the IPAM's answer time when it keeps up (tens of milliseconds) and
	// below its lag in a burst it is behind on (seconds).
	IPAMBehind = 250 * time.Millisecond
	// IPAMGivenUp: an unanswered claim stops counting toward the lag, lest a failing pool or a
	// down IPAM make every hand-over wait.
	IPAMGivenUp = 3 * time.Second
	// IPAMWait is how long a hand-over waits for the answers while the IPAM is behind: a claim
	// handed over unanswered wakes CAPM3 again for each of the IPAM's writes.
	IPAMWait = 30 * time.Second
	// AnswerGrace: a take-over that waited for the answers leaves them this long to the admitting
	// replica, woken by the same answers.
	AnswerGrace = time.Second
)

// Hand-over and release.
const (
	// TakeOverDelay: every replica leaves another replica's admission to it this long.
	TakeOverDelay = 5 * time.Second
	// ReleaseGrace: a claim waits this long for its Metal3Data (a slow API server, a retried create).
	ReleaseGrace = 2 * time.Minute
	// ReleaseHold bounds how long past the grace period a claim is held, and a deleted waiting
	// claim keeps CAPM3's finalizer while its pool is busy.
	ReleaseHold = 10 * time.Minute
	// PoolRecheck: how often a claim held for its busy pool is looked at; a pool's burst ends in seconds.
	PoolRecheck = time.Second
	// OrphanRecheck: how often a deleted claim whose Metal3Data still exists is looked at; its
	// Metal3Data's deletion is no event of the claim.
	OrphanRecheck = 30 * time.Second
	// StrayWait: a deleted waiting IPClaim is kept this long, for an IPAM pass that listed it
	// before the deletion to end.
	StrayWait = 10 * time.Second
	// StrayRecheck: how soon a claim whose stray IPAddresses are being released is looked at again.
	StrayRecheck = time.Second
	// SurplusAge: by then every IPAM pass that allocated for a claim has written its status.
	SurplusAge = 10 * time.Second
)

// The manager.
const (
	// Concurrency: objects each controller reconciles at once; their work is a few requests.
	Concurrency = 10
	// MaxRecordedClaims bounds the claims record on a Metal3Data, which anyone who can edit one can
	// write; a template references a handful of pools.
	MaxRecordedClaims = 64
	// MemorySize bounds each in-memory record set, far above the objects in flight at once.
	MemorySize = 1 << 16
	// ReadyPoll bounds the readiness probe's wait for the caches.
	ReadyPoll = 50 * time.Millisecond
	// MetricsRead bounds a cache-size metric's read.
	MetricsRead = time.Second
	// APIQPS and APIBurst: per resource type, enough for the claims of a burst of CAPM3's template
	// loop without queueing, which would delay its admissions.
	APIQPS   = 100
	APIBurst = 200
	// Lease, RenewDeadline and RetryPeriod are controller-runtime's defaults.
	Lease         = 15 * time.Second
	RenewDeadline = 10 * time.Second
	RetryPeriod   = 2 * time.Second
)

// Next is how soon a controller looks again after an action that left more to decide.
const Next = time.Millisecond

// ValidationLiveCheck bounds template validation's live reads, well below its webhook's 5 s: a
// slow API server costs warnings, never the admission.
const ValidationLiveCheck = 2 * time.Second
