# syntax=docker/dockerfile:1
# The agent injector image: holds only the static /orchard-agent. The operator runs it as the init
# container of every sandbox pod (`/orchard-agent install /opt/orchard`), which copies the binary into
# an emptyDir; the task container (any image, even scratch or distroless) then runs it from there.
#   docker build -f images/agent.Dockerfile -t ghcr.io/orchard-env/orchard-agent:0.1.0 .   (or `make image`)

FROM docker.io/library/rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
# Same flags and profile as `make agent`: glibc linked statically (crt-static), LTO, stripped.
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    RUSTFLAGS="-C target-feature=+crt-static" \
    cargo build --profile agent --locked -p orchard-agent --target x86_64-unknown-linux-gnu && \
    cp target/x86_64-unknown-linux-gnu/agent/orchard-agent /orchard-agent

FROM scratch
LABEL org.opencontainers.image.title="orchard-agent" \
      org.opencontainers.image.description="Orchard Env sandbox agent (static binary, injected by an init container)" \
      org.opencontainers.image.source="https://github.com/orchard-env/orchard-env-operator" \
      org.opencontainers.image.licenses="Apache-2.0"
COPY --from=build /orchard-agent /orchard-agent
USER 65532:65532
ENTRYPOINT ["/orchard-agent"]
