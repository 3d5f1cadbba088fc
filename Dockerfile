# syntax=docker/dockerfile:1

# ---- build ----
FROM golang:1.26 AS build
WORKDIR /src

# Module downloads are cached separately from the source.
COPY go.mod go.sum ./
RUN go mod download

COPY . .
# docker build --build-arg VERSION=v1.2.3 --build-arg REVISION=$(git rev-parse HEAD) .
ARG VERSION=devel
ARG REVISION=unknown
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath \
      -ldflags "-s -w -X main.version=${VERSION} -X main.revision=${REVISION}" \
      -o /out/lockpool ./cmd/lockpool

# ---- run ----
# distroless/static: CA certificates, /etc/passwd with nonroot (65532), no
# shell, no package manager. Runs as a non-root user and needs no writable
# file system (run it with a read-only root file system).
FROM gcr.io/distroless/static-debian12:nonroot

COPY --from=build /out/lockpool /lockpool
# The image's config takes every value from the environment
# (deploy/docker/config.yaml); mount your own over it for more applications.
COPY deploy/docker/config.yaml /etc/lockpool/config.yaml

# Defaults of the variables the config reads. PGHOST and APP_PASSWORD have
# none: lockpool refuses to start without them. The admin listener stays on
# loopback inside the container unless LOCKPOOL_ADMIN_LISTEN is set, and a
# non-loopback admin address needs LOCKPOOL_ADMIN_TOKEN (config validation).
ENV LOCKPOOL_LISTEN=0.0.0.0:6432 \
    LOCKPOOL_ADMIN_LISTEN=127.0.0.1:9930 \
    LOCKPOOL_ADMIN_TOKEN= \
    LOCKPOOL_LOG_FORMAT=json \
    LOCKPOOL_LOG_LEVEL=info \
    LOCKPOOL_SHUTDOWN_TIMEOUT=30s \
    PGPORT=5432 \
    LOCKPOOL_SERVER_MAX_CONNECTIONS=20 \
    LOCKPOOL_SERVER_TLS=prefer \
    APP_NAME=app \
    APP_USER=app \
    APP_DATABASE=appdb \
    APP_MAX_CONNECTIONS=4 \
    APP_MAX_PINNED=1

USER 65532:65532
# 6432: client connections; 9930: admin (/metrics, /up, /health/ready).
EXPOSE 6432 9930
# SIGTERM drains for shutdown_timeout; give the runtime at least that
# (docker stop -t 40, Kubernetes terminationGracePeriodSeconds).
STOPSIGNAL SIGTERM
ENTRYPOINT ["/lockpool", "-config", "/etc/lockpool/config.yaml"]
