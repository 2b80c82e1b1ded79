# ip-preallocator — kubebuilder-style targets.
SHELL := /usr/bin/env bash -o pipefail
.SHELLFLAGS := -ec

BIN := $(CURDIR)/bin
CONTROLLER_GEN := $(BIN)/controller-gen
KUSTOMIZE := $(BIN)/kustomize
GOLANGCI_LINT := $(BIN)/golangci-lint
export GONOSUMDB := github.com/metal3-io
# The test control plane's binaries; the kubectl suites find them here.
export KUBEBUILDER_ASSETS := $(BIN)
export PATH := $(BIN):$(PATH)

# VERSION is stamped into the binary (--version, the ip_preallocator_build_info metric) and labels
# the release; IMG is the image the release's Deployment runs.
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
# REVISION is stamped beside VERSION: the image's build context has no .git to read it from.
REVISION ?= $(shell git rev-parse HEAD 2>/dev/null || echo unknown)
IMG ?= ip-preallocator:$(VERSION)
PLATFORMS ?= linux/amd64,linux/arm64
RELEASE_DIR ?= out
# Set exactly as CAPM3's variable of the same name: true renders the release with
# config/components/bmh-name-based, which names IPClaims <baremetalhost>-<pool> as CAPM3 then does.
ENABLE_BMH_NAME_BASED_PREALLOCATION ?= false
# false renders the release without the Metal3DataTemplate validation (config/components/no-template-validation).
TEMPLATE_VALIDATION ?= true
# true adds the alerts as a PrometheusRule (config/components/prometheus-rules; needs the Prometheus
# Operator's CRDs).
PROMETHEUS_RULES ?= false
# Scope the release as CAPM3's --namespace and --watch-filter scope CAPM3: the webhooks' namespace
# and object selectors, and the flags that restrict the caches and controllers.
WATCH_NAMESPACE ?=
WATCH_FILTER ?=
KUBECTL ?= kubectl
# The one way the webhook binary is built: by make build here, in CI (the test harness runs it)
# and in the Dockerfile. Static (no cgo), reproducible paths, the version stamped.
WEBHOOK_BIN ?= $(BIN)/webhook
GO_BUILD = CGO_ENABLED=0 go build -trimpath -ldflags "-s -w -X main.version=$(VERSION) -X main.revision=$(REVISION)"

.PHONY: all
all: build

##@ Development

.PHONY: manifests
manifests: $(CONTROLLER_GEN) ## Generate the webhook configurations and RBAC from the markers.
	$(CONTROLLER_GEN) rbac:roleName=manager-role webhook paths="./pkg/...;./cmd/..." \
		output:rbac:artifacts:config=config/rbac output:webhook:artifacts:config=config/webhook

.PHONY: fmt
fmt: ## Format the code.
	gofmt -w $$(git ls-files '*.go')

.PHONY: lint
lint: $(GOLANGCI_LINT) ## golangci-lint (.golangci.yml, close to Cluster API's, govet included) on both modules: the product's and the test module; gofmt on the test module.
	$(GOLANGCI_LINT) run ./...
	cd test && $(GOLANGCI_LINT) run --config $(CURDIR)/.golangci.yml ./...
	@out=$$(gofmt -l test); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

.PHONY: verify-manifests
verify-manifests: manifests ## Fail when the generated manifests are not committed.
	@git diff --exit-code -- config/ || { echo "config/ is out of date: run make manifests"; exit 1; }

# Build outputs must never be committed: a 77 MB binary once was.
MAX_FILE_BYTES ?= 1048576

.PHONY: verify-file-sizes
verify-file-sizes: ## Fail when a tracked file is over MAX_FILE_BYTES (1 MiB).
	@big=$$(git ls-files -z | xargs -0 -r stat -c '%s %n' 2>/dev/null | awk -v max=$(MAX_FILE_BYTES) '$$1 > max'); \
	if [ -n "$$big" ]; then echo "tracked files over $(MAX_FILE_BYTES) bytes (build outputs belong in .gitignore):"; echo "$$big"; exit 1; fi

.PHONY: test-unit
test-unit: ## Unit tests of the product module only: no control plane, no tools.
	go test -count=1 ./...

# A count of inputs, not a duration: a duration shorter than the phase that first runs the cached
# corpus fails with "context deadline exceeded" on a loaded machine.
FUZZTIME ?= 3000x

.PHONY: fuzz
fuzz: ## Run each fuzz target of the product module for $(FUZZTIME) (make test runs their seed corpora only).
	@for pkg in $$(grep -rl --include='*_test.go' '^func Fuzz' pkg internal cmd | xargs -n1 dirname | sort -u); do \
		for target in $$(grep -ho '^func Fuzz[A-Za-z0-9_]*' $$pkg/*_test.go | cut -d' ' -f2); do \
			echo "go test -fuzz $$target ./$$pkg"; \
			go test -run '^$$' -fuzz "^$$target\$$" -fuzztime $(FUZZTIME) ./$$pkg || exit 1; \
		done; \
	done

.PHONY: test
test: tools lint verify-manifests verify-file-sizes test-unit ## Unit tests and the suites of the test module against a real control plane.
	@# test-unit runs every fuzz target's seed corpus; make fuzz explores beyond it. Then the suites,
	@# one at a time, each with its own timeout; the quick fault scenarios only (make faults runs them
	@# all at full size).
	hack/test-suites.sh

.PHONY: suites
suites: tools ## Only the test module's suites, one at a time; SUITES="bench demo" picks some.
	hack/test-suites.sh

.PHONY: demo
demo: tools ## Run the webhook with CAPM3 and the Metal3 IPAM on an embedded control plane and apply examples/.
	cd test && go run ./demo $(DEMO_ARGS)

.PHONY: bench
# SCENARIOS=default-limits/backlog,raised-limits/burst runs only those scenarios and keeps the saved
# results of the others where they measured the same product code at the same sizes: a run split
# across sessions; the page names the parts and any scenario not run yet.
BENCH_PART = $(if $(SCENARIOS),--merge --scenarios=$(SCENARIOS))
bench: tools ## Measure preallocated against stock CAPM3 (SCENARIOS= for a part); writes bench/results/ (see docs/benchmarks.md).
	cd test && go run ./bench $(BENCH_ARGS) $(BENCH_PART)

.PHONY: bench-scale
bench-scale: tools ## Measure preallocated against stock CAPM3 at the sizes users run, beside a standing fleet of 5,000 machines (SCENARIOS= for a part); writes bench/results/scale/ and its section of docs/benchmarks.md.
	cd test && go run ./bench $(BENCH_SCALE_ARGS) $(BENCH_PART)

# --scale-raised in BENCH_SCALE_ARGS adds the raised-limits burst beside the no-op webhook (about
# 30 minutes more), and --slow=1000 with it the slow arrival (about 30 more).
BENCH_SCALE_ARGS ?= --scale --fleet=5000 --burst=1000 --raised-burst=1000 --backlog=1000 --repeats=2 --backlog-pause=180s --timeout=30m

.PHONY: footprint
footprint: tools ## Measure the webhook's memory with a standing fleet of 1,000 and 5,000 machines cached; writes docs/footprint.md.
	cd test && go run ./footprint $(FOOTPRINT_ARGS)

.PHONY: faults
# SCENARIOS='kills|leader-loss' runs only those scenarios and merges them into the page with the
# earlier parts of the same run (same product code and seed): a run split across sessions. MORE=1
# adds the part's trials to the earlier parts' trials of those scenarios instead of replacing them.
FAULTS_RUN = $(if $(SCENARIOS),FAULTS_MERGE=1) $(if $(MORE),FAULTS_MORE=1) go test -count=1 -v -timeout 180m ./faults $(if $(SCENARIOS),-run 'TestFaults/^($(SCENARIOS))$$')
faults: tools ## Run the fault suite at full size: five trials of each scenario and its baseline, up to 12 where the power asks (SCENARIOS= for a part, FAULTS_SEED repeats a run); writes docs/reliability.md and its evidence docs/reliability.json.
	cd test && FAULTS_FULL=1 FAULTS_REPORT=$(CURDIR)/docs/reliability.md $(FAULTS_RUN)

.PHONY: faults-corrected-ipam
faults-corrected-ipam: tools ## make faults with a test double of the Metal3 IPAM with the races docs/reliability.md names fixed (FAULTS_IPAM_CORRECTIONS=all, or a list, picks others); writes docs/reliability-corrected-ipam.md and .json.
	cd test && FAULTS_FULL=1 FAULTS_IPAM=corrected FAULTS_REPORT=$(CURDIR)/docs/reliability-corrected-ipam.md $(FAULTS_RUN)

.PHONY: build
build: ## Build the webhook binary into bin/ (static, VERSION stamped), as CI and the Dockerfile do.
	$(GO_BUILD) -o $(WEBHOOK_BIN) ./cmd/webhook

.PHONY: run
run: build ## Run the webhook against the current kubeconfig, with certificates in $(CERT_DIR).
	$(BIN)/webhook --webhook-cert-dir=$${CERT_DIR:-/tmp/k8s-webhook-server/serving-certs} --insecure-diagnostics

##@ Release

.PHONY: release
release: $(KUSTOMIZE) ## Write $(RELEASE_DIR)/install.yaml for kubectl apply: config/default with IMG, VERSION, ENABLE_BMH_NAME_BASED_PREALLOCATION, TEMPLATE_VALIDATION, PROMETHEUS_RULES, WATCH_NAMESPACE and WATCH_FILTER.
	@mkdir -p $(RELEASE_DIR)
	@overlay=$$(mktemp -d) && trap 'rm -rf "$$overlay"' EXIT && cd "$$overlay" && \
	$(KUSTOMIZE) create --resources "$$(realpath --relative-to=. $(CURDIR)/config/default)" && \
	$(KUSTOMIZE) edit set image ip-preallocator=$(IMG) && \
	$(KUSTOMIZE) edit add label --without-selector --include-templates app.kubernetes.io/version:$(VERSION) && \
	if [ "$(ENABLE_BMH_NAME_BASED_PREALLOCATION)" = true ]; then \
		$(KUSTOMIZE) edit add component "$$(realpath --relative-to=. $(CURDIR)/config/components/bmh-name-based)"; fi && \
	if [ "$(TEMPLATE_VALIDATION)" = false ]; then \
		$(KUSTOMIZE) edit add component "$$(realpath --relative-to=. $(CURDIR)/config/components/no-template-validation)"; fi && \
	if [ "$(PROMETHEUS_RULES)" = true ]; then \
		$(KUSTOMIZE) edit add component "$$(realpath --relative-to=. $(CURDIR)/config/components/prometheus-rules)"; fi && \
	if [ -n "$(WATCH_NAMESPACE)" ]; then \
		$(KUSTOMIZE) edit add patch --kind Deployment --patch '[{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--namespace=$(WATCH_NAMESPACE)"}]' && \
		for kind in MutatingWebhookConfiguration ValidatingWebhookConfiguration; do \
			$(KUSTOMIZE) edit add patch --kind $$kind --patch '[{"op":"add","path":"/webhooks/0/namespaceSelector","value":{"matchLabels":{"kubernetes.io/metadata.name":"$(WATCH_NAMESPACE)"}}}]'; done; fi && \
	if [ -n "$(WATCH_FILTER)" ]; then \
		$(KUSTOMIZE) edit add patch --kind Deployment --patch '[{"op":"add","path":"/spec/template/spec/containers/0/args/-","value":"--watch-filter=$(WATCH_FILTER)"}]' && \
		for kind in MutatingWebhookConfiguration ValidatingWebhookConfiguration; do \
			$(KUSTOMIZE) edit add patch --kind $$kind --patch '[{"op":"add","path":"/webhooks/0/objectSelector","value":{"matchLabels":{"cluster.x-k8s.io/watch-filter":"$(WATCH_FILTER)"}}}]'; done; fi && \
	$(KUSTOMIZE) build . > $(abspath $(RELEASE_DIR))/install.yaml
	@echo "$(RELEASE_DIR)/install.yaml: $(IMG), version $(VERSION), BMH-name-based claims $(ENABLE_BMH_NAME_BASED_PREALLOCATION)"

.PHONY: docker-build
docker-build: ## Build the image IMG for this machine's platform with docker.
	docker build --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) -t $(IMG) .

.PHONY: docker-buildx
docker-buildx: ## Build and push the image IMG for PLATFORMS with docker buildx.
	docker buildx build --platform=$(PLATFORMS) --build-arg VERSION=$(VERSION) --build-arg REVISION=$(REVISION) -t $(IMG) --push .

.PHONY: docker-push
docker-push: ## Push the image IMG.
	docker push $(IMG)

.PHONY: deploy
deploy: release ## Install the release into the cluster of the current kubeconfig (cert-manager must run).
	$(KUBECTL) apply -f $(RELEASE_DIR)/install.yaml

.PHONY: undeploy
undeploy: ## Uninstall $(RELEASE_DIR)/install.yaml as deployed, not rendered again, in the safe order: mutating webhook, waiting claims finished, the rest.
	@test -f $(RELEASE_DIR)/install.yaml || { echo "$(RELEASE_DIR)/install.yaml is missing: set RELEASE_DIR to the release you deployed"; exit 1; }
	KUBECTL=$(KUBECTL) hack/undeploy.sh $(RELEASE_DIR)/install.yaml

.PHONY: verify-install
verify-install: ## After an install, with kubectl only (KUBECTL, the current kubeconfig): admit a Metal3Data in a throw-away namespace, show its preallocated claims and their hand-over, remove everything; PASS or FAIL with the reason.
	KUBECTL="$(KUBECTL)" hack/verify-install.sh

##@ Tools

.PHONY: tools
tools: ## Build etcd, kube-apiserver, kube-controller-manager, kubectl, the in-cluster IPAM provider, controller-gen, kustomize and golangci-lint into bin/.
	hack/build-tools.sh

# Each alone, so that make release needs only kustomize (about a minute to build on a fresh machine).
$(CONTROLLER_GEN) $(KUSTOMIZE) $(GOLANGCI_LINT):
	hack/build-tools.sh $(notdir $@)

.PHONY: help
help: ## Show the targets.
	@awk 'BEGIN {FS = ":.*##"} /^[a-zA-Z_-]+:.*?##/ { printf "  %-18s %s\n", $$1, $$2 } /^##@/ { printf "\n%s\n", substr($$0, 5) }' $(MAKEFILE_LIST)
