// Package faults is the fault suite of ip-preallocator: it runs the real control plane
// (kube-apiserver, etcd, kube-controller-manager with the garbage collector and the namespace
// controller), the real CAPM3 Metal3Data controller and Metal3 IPAM in-process, the Cluster API
// in-cluster IPAM provider, and two webhook replicas under leader election behind a load balancer,
// injects faults while streams of Metal3Data are admitted, and checks afterwards that CAPM3 was
// never blocked and no claim was stranded.
//
// `go test ./faults` runs a quick version of every scenario; FAULTS_FULL=1 selects the full sizes,
// and FAULTS_REPORT=<file> writes the measured figures as Markdown (`make faults` does both and
// writes docs/reliability.md). FAULTS_IPAM=corrected puts the corrected IPAM test double of
// test/stack in the Metal3 IPAM's place, with the corrections FAULTS_IPAM_CORRECTIONS lists (by
// default those of the races the page names), so that what the suite finds then is ours.
//
// A scenario runs more trials than its size's while a comparison with stock lacks the criterion's
// power, up to FAULTS_MAX_TRIALS. FAULTS_MERGE=1 with a -run pattern of some scenarios runs a part
// of a run: the page then also holds the earlier parts' scenarios, from the JSON beside it, when
// they measured the same product code (`make faults SCENARIOS=...`); FAULTS_MORE=1 adds the
// part's trials to the earlier parts' trials of the same scenarios (`MORE=1`).
package faults
