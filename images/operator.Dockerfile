# syntax=docker/dockerfile:1
# The operator image: one static binary on an empty base, running as uid 65532.
#   docker build -f images/operator.Dockerfile -t ghcr.io/orchard-env/orchard-operator:0.1.0 .   (or `make image`)
# The build context is the repository root (see .dockerignore).

FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# glibc with crt-static, like `make agent`: no libc is needed at run time, so the final stage can be
# FROM scratch. The operator reaches the API server by the IP in KUBERNETES_SERVICE_HOST and sandbox
# agents by pod IP, so it never needs glibc's NSS (name resolution) at run time. A static binary reads
# randomness from /dev/random and /dev/urandom (getrandom cannot find glibc's wrapper), which every
# container runtime provides in /dev. This exact cargo command was checked outside docker: the binary
# runs in an empty root as uid 65532 with in-cluster configuration and takes its Lease.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --release --locked -p orchard-operator --bin orchard-operator \
      --target x86_64-unknown-linux-gnu && \
    cp target/x86_64-unknown-linux-gnu/release/orchard-operator /orchard-operator

FROM scratch
LABEL org.opencontainers.image.title="orchard-operator" \
      org.opencontainers.image.description="Orchard Env operator: Sandbox and RolloutGroup controllers, gateway, metrics" \
      org.opencontainers.image.source="https://github.com/orchard-env/orchard-env-operator" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /orchard-operator /orchard-operator
# Non-root, matching the chart's securityContext (runAsUser 65532, runAsNonRoot).
USER 65532:65532
EXPOSE 8080 8081
ENTRYPOINT ["/orchard-operator"]
