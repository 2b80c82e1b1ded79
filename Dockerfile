# Builds the webhook image referenced by config/manager (ip-preallocator:latest).
FROM golang:1.26 AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN GONOSUMDB=github.com/metal3-io go mod download
COPY cmd/ cmd/
COPY pkg/ pkg/
COPY internal/ internal/
RUN CGO_ENABLED=0 go build -trimpath -o /webhook ./cmd/webhook

FROM gcr.io/distroless/static:nonroot
COPY --from=build /webhook /webhook
USER 65532:65532
ENTRYPOINT ["/webhook"]
