package main

import (
	"context"
	"fmt"
	"io"
	"maps"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
	"unicode"

	infrav1 "github.com/metal3-io/cluster-api-provider-metal3/api/v1beta2"
	ipamv1 "github.com/metal3-io/ip-address-manager/api/v1alpha1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/metal3-community/ip-preallocator/test/harness"
)

// Row is the report of one machine's Metal3Data.
type Row struct {
	// Mode is modePreallocated when ip-preallocator's mutating webhook answered its create.
	Mode string
	Data types.NamespacedName
	// DataAfter is when CAPM3's template controller had created the Metal3Data (its admission
	// included), ReadyAfter when it was Ready, both from the Metal3DataClaim's create request.
	DataAfter, ReadyAfter time.Duration
	Reconciles            Reconciles
	// Claims created for it by CAPM3 (counted by test/stack) and by the webhook (the claims that
	// carried the preallocated-for annotation when created).
	ClaimsByCAPM3, ClaimsByWebhook int
	// CAPM3CreatedWarned counts the claims CAPM3 created that the webhook said, in a Warning
	// Event, it had left to CAPM3.
	CAPM3CreatedWarned int
	// Addresses maps a pool to the address of the Metal3Data's claim on it.
	Addresses map[string]string
	// FirstSawWaitingClaim: CAPM3's first reconcile read a claim not handed over yet.
	FirstSawWaitingClaim bool
}

// Reconciles splits CAPM3's reconciles of one Metal3Data by how they ended.
type Reconciles struct {
	// Work created claims or rendered the Secrets and finished.
	Work int
	// Requeue ended asking to be run again: the claims were not fulfilled yet.
	Requeue int
	// NoOp had nothing new to write (at most it re-patched a status its cache had not caught up with).
	NoOp int
	// History is test/stack's letter per reconcile: W work, P status patch only, . nothing;
	// lowercase (, for .) when requeued.
	History string
}

// Total is the number of reconciles.
func (r Reconciles) Total() int { return r.Work + r.Requeue + r.NoOp }

func classify(history string) Reconciles {
	r := Reconciles{History: history}
	for _, letter := range history {
		switch {
		case letter == 'W':
			r.Work++
		case unicode.IsLower(letter) || letter == ',':
			r.Requeue++
		default:
			r.NoOp++
		}
	}
	return r
}

// auditCreates returns the create request of each object of a resource, dry runs included, from
// the API server's audit log: when it arrived, before any webhook ran, when it was answered, and
// which webhooks answered.
func auditCreates(cp *harness.ControlPlane, resource string) (map[types.NamespacedName]harness.AuditEvent, error) {
	events, err := cp.AuditSince(0)
	if err != nil {
		return nil, err
	}
	creates := map[types.NamespacedName]harness.AuditEvent{}
	for _, e := range events {
		if e.Verb == "create" && e.ObjectRef.Resource == resource && e.ObjectRef.Subresource == "" && e.ResponseStatus.Code < 300 {
			creates[types.NamespacedName{Namespace: e.ObjectRef.Namespace, Name: e.ObjectRef.Name}] = e
		}
	}
	return creates, nil
}

// webhookCalled tells whether ip-preallocator's mutating webhook answered the request: the API
// server records each mutating webhook it called as an audit annotation.
func webhookCalled(e harness.AuditEvent) bool {
	for key, value := range e.Annotations {
		if strings.HasPrefix(key, "mutation.webhook.admission.k8s.io/") && strings.Contains(value, "ip-preallocator.metal3.io") {
			return true
		}
	}
	return false
}

// rows reports on Metal3Data that are Ready.
func (d *demo) rows(ctx context.Context, keys []types.NamespacedName) ([]Row, error) {
	dataCreates, err := auditCreates(d.cp, "metal3datas")
	if err != nil {
		return nil, err
	}
	claimCreates, err := auditCreates(d.cp, "metal3dataclaims")
	if err != nil {
		return nil, err
	}
	var rows []Row
	for _, key := range keys {
		create, ok := dataCreates[key]
		if !ok {
			return nil, fmt.Errorf("no create of Metal3Data %s in the audit log", key)
		}
		data := &infrav1.Metal3Data{}
		if err := d.cp.Client.Get(ctx, key, data); err != nil {
			return nil, err
		}
		claimCreate, ok := claimCreates[types.NamespacedName{Namespace: key.Namespace, Name: data.Spec.Claim.Name}]
		if !ok {
			return nil, fmt.Errorf("no create of the Metal3DataClaim of %s in the audit log", key)
		}
		row, err := d.row(ctx, key, claimCreate, create)
		if err != nil {
			return nil, err
		}
		rows = append(rows, row)
	}
	return rows, nil
}

func (d *demo) row(ctx context.Context, key types.NamespacedName, claimCreate, create harness.AuditEvent) (Row, error) {
	readyAt, _ := d.ready.Ready(key)
	stats := d.counter.Of(key)
	claimAt := claimCreate.RequestReceivedTimestamp.Time
	row := Row{
		Mode: modeStock, Data: key, DataAfter: create.StageTimestamp.Sub(claimAt), ReadyAfter: readyAt.Sub(claimAt),
		Reconciles: classify(stats.History), ClaimsByCAPM3: stats.ClaimsCreated, Addresses: map[string]string{},
		FirstSawWaitingClaim: stats.FirstReconcileSawWaitingClaim,
	}
	if webhookCalled(create) {
		row.Mode = modePreallocated
		left, err := harness.ClaimsLeftToCAPM3(ctx, d.cp.Client, key.Namespace)
		if err != nil {
			return Row{}, err
		}
		for _, c := range stats.CreatedClaims {
			if left[c] {
				row.CAPM3CreatedWarned++
			}
		}
	}
	claims := &ipamv1.IPClaimList{}
	if err := d.cp.Client.List(ctx, claims, client.InNamespace(key.Namespace)); err != nil {
		return Row{}, err
	}
	for _, claim := range claims.Items {
		if !ownedBy(claim.OwnerReferences, key.Name) {
			continue
		}
		if d.origins.createdByWebhook(client.ObjectKeyFromObject(&claim)) {
			row.ClaimsByWebhook++
		}
		if claim.Status.Address == nil {
			continue
		}
		addr := &ipamv1.IPAddress{}
		if err := d.cp.Client.Get(ctx, client.ObjectKey{Namespace: key.Namespace, Name: claim.Status.Address.Name}, addr); err != nil {
			return Row{}, err
		}
		row.Addresses[claim.Spec.Pool.Name] = fmt.Sprintf("%s/%d", addr.Spec.Address, addr.Spec.Prefix)
	}
	return row, nil
}

func ownedBy(refs []metav1.OwnerReference, name string) bool {
	return slices.ContainsFunc(refs, func(r metav1.OwnerReference) bool { return r.Kind == "Metal3Data" && r.Name == name })
}

func printTable(out io.Writer, rows []Row) {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "MODE\tMETAL3DATA\tCREATED AFTER\tREADY AFTER\tRECONCILES\tWORK\tREQUEUE\tNO-OP\tHISTORY\tCLAIMS CREATED BY\tADDRESSES")
	for _, r := range rows {
		rc := r.Reconciles
		fmt.Fprintf(w, "%s\t%s\t%v\t%v\t%d\t%d\t%d\t%d\t%s\t%s\t%s\n", r.Mode, r.Data,
			r.DataAfter.Round(time.Millisecond), r.ReadyAfter.Round(time.Millisecond),
			rc.Total(), rc.Work, rc.Requeue, rc.NoOp, rc.History, creators(r), addresses(r.Addresses))
	}
	w.Flush()
}

func creators(r Row) string {
	var by []string
	if r.ClaimsByWebhook > 0 {
		by = append(by, fmt.Sprintf("webhook %d", r.ClaimsByWebhook))
	}
	if r.ClaimsByCAPM3 > 0 || r.ClaimsByWebhook == 0 {
		by = append(by, fmt.Sprintf("CAPM3 %d", r.ClaimsByCAPM3))
	}
	return strings.Join(by, ", ")
}

func addresses(byPool map[string]string) string {
	var out []string
	for _, pool := range slices.Sorted(maps.Keys(byPool)) {
		out = append(out, pool+"="+byPool[pool])
	}
	return strings.Join(out, " ")
}

const lineWidth = 110

const legend = "RECONCILES are CAPM3's reconciles of the Metal3Data: WORK created the claims or rendered the data " +
	"and finished, REQUEUE ended waiting for addresses, NO-OP had nothing new to write. HISTORY has a letter per " +
	"reconcile: W work, P status re-patch, . nothing; lowercase (, for .) when it requeued. CREATED AFTER is " +
	"when CAPM3's Metal3DataTemplate controller had created the Metal3Data (its admission included), READY " +
	"AFTER when it was Ready, both counted from the create request of the machine's Metal3DataClaim."

// summary is one mode's totals.
type summary struct {
	n, reconciles, requeues, claims, claimsByCAPM3 int
	// firstWork counts Metal3Data whose first reconcile did the work; of the others,
	// firstNotHandedOver met a claim not handed over yet.
	firstWork, firstNotHandedOver int
	medianCreated, medianReady    time.Duration
}

func summarize(rows []Row, mode string) summary {
	var s summary
	var created, ready []time.Duration
	for _, r := range rows {
		if r.Mode != mode {
			continue
		}
		s.n++
		s.reconciles += r.Reconciles.Total()
		s.requeues += r.Reconciles.Requeue
		s.claims += r.ClaimsByCAPM3 + r.ClaimsByWebhook
		s.claimsByCAPM3 += r.ClaimsByCAPM3
		if h := r.Reconciles.History; h != "" && h[0] == 'W' {
			s.firstWork++
		} else if r.FirstSawWaitingClaim {
			s.firstNotHandedOver++
		}
		created, ready = append(created, r.DataAfter), append(ready, r.ReadyAfter)
	}
	s.medianCreated, s.medianReady = median(created), median(ready)
	return s
}

func median(ds []time.Duration) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	sorted := slices.Clone(ds)
	slices.Sort(sorted)
	return sorted[len(sorted)/2]
}

// printComparison prints the ratios of preallocated to stock, and why they differ.
func printComparison(out io.Writer, rows []Row) {
	stock, pre := summarize(rows, modeStock), summarize(rows, modePreallocated)
	if stock.n == 0 || pre.n == 0 {
		return
	}
	ms := func(d time.Duration) time.Duration { return d.Round(time.Millisecond) }
	fmt.Fprintln(out)
	fmt.Fprintln(out, wrap(fmt.Sprintf("With the webhook: Ready after %v instead of %v (median, %.2f×), the Metal3Data created after "+
		"%v instead of %v (the webhook's admission is in there); %d CAPM3 reconciles instead of %d "+
		"(%.2f×), %d requeues instead of %d; CAPM3 created %d of %d claims instead of %d of %d.",
		ms(pre.medianReady), ms(stock.medianReady), ratio(float64(pre.medianReady), float64(stock.medianReady)),
		ms(pre.medianCreated), ms(stock.medianCreated),
		pre.reconciles, stock.reconciles, ratio(float64(pre.reconciles), float64(stock.reconciles)),
		pre.requeues, stock.requeues, pre.claimsByCAPM3, pre.claims, stock.claimsByCAPM3, stock.claims)))
	fmt.Fprintln(out, wrap("Why: stock CAPM3 creates the claims in its first reconcile, then requeues until the IPAM has filled them; "+
		"claim updates wake it until the addresses are in. With the webhook the claims exist before CAPM3 first looks: "+
		firstLook(pre)+". The last no-op, in both modes, is CAPM3 woken by its own status update."))
}

// firstLook says what CAPM3's first reconcile of each preallocated Metal3Data met.
func firstLook(s summary) string {
	notFilled := s.n - s.firstWork - s.firstNotHandedOver
	parts := []string{fmt.Sprintf("its first reconcile rendered %d of %d at once", s.firstWork, s.n)}
	if notFilled > 0 {
		parts = append(parts, fmt.Sprintf("for %d the IPAM had not filled the claims yet", notFilled))
	}
	if s.firstNotHandedOver > 0 {
		parts = append(parts, fmt.Sprintf("for %d a claim was not handed over yet", s.firstNotHandedOver))
	}
	return strings.Join(parts, ", ")
}

// wrap breaks text into lines of at most lineWidth characters, at spaces.
func wrap(text string) string {
	var lines []string
	line := ""
	for _, word := range strings.Fields(text) {
		if line != "" && len(line)+1+len(word) > lineWidth {
			lines = append(lines, line)
			line = ""
		}
		line = strings.TrimPrefix(line+" "+word, " ")
	}
	return strings.Join(append(lines, line), "\n")
}

func ratio(a, b float64) float64 {
	if b == 0 {
		return 0
	}
	return a / b
}
