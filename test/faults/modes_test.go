package faults

import (
	"fmt"
)

// failureMode is what the page tells an operator of one count: what happens, whose it is, and
// what to do.
type failureMode struct {
	count, happens, whose, todo string
}

var failureModes = []failureMode{
	{invNotReady, "a machine waits: its Metal3Data is not rendered within the checks' time",
		"CAPM3's or the IPAM's where stock shows it too", "docs/troubleshooting.md, \"Claims that stay longer than you expect\"; CAPM3 looks again every 30 s"},
	{invNoOwner, "a claim is never handed over, so CAPM3 cannot use it", "the webhook's",
		"the leader releases it after `--release-grace-period`; docs/troubleshooting.md"},
	{invTerminating, "a deleted claim keeps a finalizer, and its namespace waits for it",
		"the IPAM's (its finalizer) or, on a waiting claim, the webhook's leader (CAPM3's)", "docs/troubleshooting.md, \"A namespace that takes long to delete\""},
	{invOrphanAddress, "an address stays taken with no claim", "the Metal3 IPAM's race (Known problems below)",
		"check that no claim names it, then remove its finalizer and delete the IPAddress"},
	{invLeakedAddress, "a claim holds two IPAddresses: one address is taken for nothing", "the Metal3 IPAM's two pool controllers",
		"the webhook releases the second one of the claims it created; of others, delete the IPAddress the claim's status does not name"},
	{invDoubleAllocation, "one address is given to two claims: two machines could get the same IP", "the Metal3 IPAM, which keys addresses by claim name",
		"the JSON beside this page names the claims; delete the one whose Metal3Data is not Ready, and the IPAM allocates it anew"},
	{invOursAddresses, "one of the four above, on a claim the webhook created", "the IPAM's races (as on CAPM3's claims); the webhook's against the corrected double with every correction, where the goal is none",
		"as for the count it is one of; report it when the double with every correction shows one"},
	{invCAPM3Claims, "CAPM3 created a claim the webhook should have: that machine gets no gain, and no harm", "the webhook's",
		"nothing; the skip reasons in docs/troubleshooting.md say why"},
	{invUnanswered, "an admission was not answered, no fault injected: its Metal3Data waited for the webhook's timeout", "the webhook's",
		"the NotCalled alert; docs/troubleshooting.md, \"The API server does not reach the webhook\""},
	{invNamespaces, "a namespace takes more than 30 s to be deleted", "CAPM3's 30 s requeue and the namespace controller's back-off; the webhook's when a waiting claim keeps CAPM3's finalizer",
		"wait; docs/troubleshooting.md says what it waits for"},
	{invNamespacesStuck, "a namespace is not gone in 120 s: a finalizer nobody removes", "whoever's finalizer it is: the page's evidence (JSON) names it",
		"docs/troubleshooting.md, \"A namespace that takes long to delete\""},
	{invNamespacesIPAM, "a namespace is not gone in 120 s, held only by IPAddresses the Metal3 IPAM stranded and their IPPools", "the Metal3 IPAM's: an IPAddress outlives its claim (Known problems), and its pool waits for it",
		"docs/troubleshooting.md, \"A namespace that takes long to delete\": an IPAddress whose claim is gone"},
	{invOursLeft, "a claim the webhook created outlives its namespace's deletion", "the webhook's: the goal is none",
		"docs/troubleshooting.md, \"A namespace that takes long to delete\"; report it"},
	{invOthersLeft, "a claim CAPM3 created outlives its namespace's deletion", "CAPM3's or the IPAM's",
		"docs/troubleshooting.md: the IPAM's own stuck claims"},
}

// failureModes is the page's table of failure modes: per 1,000 stored Metal3Data with the webhook
// (every scenario) and without it (the baselines), whose it is, and what to do.
func (r *suiteReport) failureModes() []string {
	stored, ours := r.leaks(false)
	stockStored, stock := r.leaks(true)
	perThousand := func(k int64, n int) string {
		if n == 0 {
			return "–"
		}
		return fmt.Sprintf("%.1f", 1000*float64(k)/float64(n))
	}
	out := []string{"## Failure modes", "",
		"| what | what happens | per 1,000 Metal3Data, with the webhook / stock | whose | what to do |",
		"|---|---|---:|---|---|"}
	for _, m := range failureModes {
		out = append(out, fmt.Sprintf("| %s | %s | %s / %s | %s | %s |", m.count, m.happens,
			perThousand(ours[m.count], stored), perThousand(stock[m.count], stockStored), m.whose, m.todo))
	}
	return out
}
