# syntax=docker/dockerfile:1
# Multi-stage build of kvrouter and vllm-sim: static binaries (CGO_ENABLED=0) on a
# distroless static base, running as a non-root user. examples/dockerfile_test.go builds
# the binaries with the exact flags of the build stage and checks they are static.
#
#   docker build --target kvrouter -t kvrouter .
#   docker build --target vllm-sim -t vllm-sim .
#
# The context has no .git (.dockerignore), so name the build for `kvrouter --version`,
# inference_extension_info and the start-up log line:
#   docker build --build-arg VERSION=$(git describe --tags --always) --build-arg COMMIT=$(git rev-parse HEAD) -t kvrouter .

ARG GO_VERSION=1.26

FROM --platform=$BUILDPLATFORM golang:${GO_VERSION} AS build
WORKDIR /src
COPY go.mod go.sum ./
RUN --mount=type=cache,target=/go/pkg/mod go mod download
COPY . .
ARG TARGETOS
ARG TARGETARCH
ARG VERSION=""
ARG COMMIT=""
ENV CGO_ENABLED=0
RUN --mount=type=cache,target=/go/pkg/mod --mount=type=cache,target=/root/.cache/go-build \
    GOOS=$TARGETOS GOARCH=$TARGETARCH go build -trimpath -ldflags="-s -w -X github.com/kvrouter/kvrouter/internal/app.buildVersion=${VERSION} -X github.com/kvrouter/kvrouter/internal/app.buildCommit=${COMMIT}" -o /out/ ./cmd/kvrouter ./testbench/cmd/vllm-sim

FROM gcr.io/distroless/static-debian12:nonroot AS vllm-sim
COPY --from=build /out/vllm-sim /vllm-sim
USER 65532:65532
EXPOSE 8000 5557
ENTRYPOINT ["/vllm-sim"]

# Last, so that a plain `docker build .` gives kvrouter.
FROM gcr.io/distroless/static-debian12:nonroot AS kvrouter
COPY --from=build /out/kvrouter /kvrouter
USER 65532:65532
EXPOSE 9002 9003 9090
ENTRYPOINT ["/kvrouter"]
