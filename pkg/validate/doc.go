// Package validate is the validating webhook of Metal3DataTemplates. It tells at `kubectl apply`
// time, with the field path, what CAPM3 would otherwise report on every Metal3Data of the template
// at reconcile time, long after the apply returned. The pool rules are pkg/allocation's, the code
// that plans the claims: this package turns allocation's typed errors into a field.ErrorList and
// warnings, and holds no CAPM3 rule of its own.
//
// It rejects only what makes CAPM3 fail every Metal3Data of the template:
//   - one pool name referenced with two apiGroups or kinds anywhere in the template (a metaData
//     *FromPool entry counts as ipam.metal3.io/IPPool, as CAPM3 reads it); field.Invalid at the
//     later reference, naming the earlier one's path;
//   - a fromPoolAnnotation whose object is not machine, metal3machine or baremetalhost (compared
//     case-insensitively, as CAPM3 does; field.NotSupported at .object), or whose annotation is
//     not a valid annotation key (at .annotation);
//   - a pool whose claims cannot be named at all: <template>-0-<pool>, the claim of index 0, must
//     be a valid DNS subdomain; the message names the pool and the name's length.
//
// It warns, and admits, when:
//   - a metaData *FromPool entry names an apiGroup or kind other than the Metal3 IPPool's: CAPM3
//     ignores them and reads a Metal3 IPPool;
//   - claim names fit for index 0 but not for every index up to maxIndex (999999); the warning
//     names the largest index that fits;
//   - a referenced pool does not exist in the template's namespace, or no installed API serves its
//     group and kind (cached discovery). These live reads end after liveCheckTimeout, well inside
//     the webhook's 5 s: a slow read costs its warning, never the admission. They run on create
//     and when the set of referenced pools changes.
//
// Field paths are allocation.References': spec.metaData.<list>[i].name for the four *FromPool
// lists (a warning about apiGroup or kind names the entry, without .name); under
// spec.networkData.networks, ipv4[i] and ipv6[i] with .fromPoolAnnotation, .fromPoolRef or
// .ipAddressFromIPPool, and on every network kind routes[j].gateway (.fromPoolRef, .fromIPPool;
// .fromPoolAnnotation on ipv4 and ipv6 only, as CAPM3 reads it) and
// routes[j].services.dnsFromIPPool; and spec.networkData.services.dnsFromIPPool.
//
// When:
//   - CREATE: everything above.
//   - UPDATE that changes spec: only the errors the change introduces are rejected. An error the
//     stored object has already (same type, field and value) becomes a warning ending "(admitted:
//     the stored Metal3DataTemplate has it already, but CAPM3 still fails on it)", so that a
//     template stored before the webhook was installed, or before a rule changed, stays editable
//     (ratcheting, as in Cluster API).
//   - Nothing else reaches the webhook: matchConditions in
//     config/webhook/validating_webhook_patch.yaml (controller-gen cannot generate them) admit,
//     without a call, every UPDATE that keeps spec (the finalizers, owner references and labels
//     CAPM3 writes) and every update of an object being deleted. DELETE is not validated.
//     Template applies the same rules itself, for API servers that do not send the conditions.
//
// The webhook fails closed (failurePolicy: Fail, as CAPM3's own webhooks): while no replica is
// available, creating a Metal3DataTemplate or changing its spec is refused, which is why the
// release runs two replicas; `make release TEMPLATE_VALIDATION=false` leaves it out. CAPM3's
// metadata updates, the deletion of a template and Metal3Data admission never wait for it.
package validate
