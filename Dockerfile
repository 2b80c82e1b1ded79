# syntax=docker/dockerfile:1
# The ip-preallocator webhook image: `make docker-build` for this machine's platform,
# `make docker-buildx` for linux/amd64 and linux/arm64 (PLATFORMS). The binary is built by
# `make build`, exactly as CI builds it: static (CGO_ENABLED=0), -trimpath, VERSION and REVISION stamped
# (--version, the ip_preallocator_build_info metric). It runs on distroless static as nonroot.
#
# The build and base images are pinned to a Go patch release and a Debian release. For a release,
# pin their digests too, e.g. --build-arg GO_IMAGE=golang:1.26.8-bookworm@sha256:<digest> (from
# `crane digest golang:1.26.8-bookworm`), and likewise BASE_IMAGE.
ARG GO_IMAGE=golang:1.26.8-bookworm
ARG BASE_IMAGE=gcr.io/distroless/static-debian12:nonroot

# The build stage runs on the builder's platform and cross-compiles for the target's.
FROM --platform=$BUILDPLATFORM ${GO_IMAGE} AS build
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=dev
ARG REVISION=unknown
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod \
    GONOSUMDB=github.com/metal3-io go mod download
COPY Makefile ./
COPY cmd/ cmd/
COPY pkg/ pkg/
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    GOOS=${TARGETOS} GOARCH=${TARGETARCH} make build VERSION=${VERSION} REVISION=${REVISION} WEBHOOK_BIN=/out/webhook

FROM ${BASE_IMAGE}
ARG VERSION=dev
ARG REVISION=unknown
LABEL org.opencontainers.image.title="ip-preallocator" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="https://github.com/metal3-community/ip-preallocator"
COPY --from=build /out/webhook /webhook
# distroless's nonroot user; the Deployment runs as it with a read-only root filesystem.
USER 65532:65532
ENTRYPOINT ["/webhook"]
