# syntax=docker/dockerfile:1

# ---- build ----
FROM golang:1.26 AS build
WORKDIR /src

# Module downloads are cached separately from the source.
COPY go.mod go.sum ./
RUN go mod download

COPY . .
RUN CGO_ENABLED=0 GOOS=linux go build -trimpath -ldflags "-s -w" -o /out/lockpool ./cmd/lockpool
# The example config listens on 127.0.0.1, which is unreachable from outside a
# container: listen on all interfaces in the image. Mount your own config over
# /etc/lockpool/config.yaml for real deployments.
RUN sed -E 's/^(listen|admin_listen):([[:space:]]*)127\.0\.0\.1:/\1:\20.0.0.0:/' config.yaml >/out/config.yaml

# ---- run ----
# distroless/static: CA certificates, /etc/passwd with nonroot (65532), no shell.
FROM gcr.io/distroless/static-debian12:nonroot

COPY --from=build /out/lockpool /lockpool
COPY --from=build /out/config.yaml /etc/lockpool/config.yaml

USER 65532:65532
# 6432: client connections; 9930: admin (/metrics, /up, /health/ready).
EXPOSE 6432 9930
ENTRYPOINT ["/lockpool", "-config", "/etc/lockpool/config.yaml"]
