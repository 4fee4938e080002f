# syntax=docker/dockerfile:1
#
# The kms-operator image: a release build (without the dev KMS) on the Rust
# image, then the binary alone on a distroless base (glibc, CA certificates,
# no shell) as the non-root user 65532. Releases are built without a
# container engine by scripts/release.sh (the same file system, reproducibly);
# this file is for those who build the image themselves.
#
#   docker build -t ghcr.io/hanzoai/kms-operator:2.0.0 .

ARG RUST_VERSION=1.95

FROM rust:${RUST_VERSION}-bookworm AS builder
WORKDIR /src
COPY . .
RUN --mount=type=cache,target=/usr/local/cargo/registry \
    --mount=type=cache,target=/src/target \
    cargo build --release --locked --no-default-features --bin kms-operator \
    && install -D -m 0755 target/release/kms-operator /out/kms-operator

FROM gcr.io/distroless/cc-debian12:nonroot
COPY --from=builder /out/kms-operator /usr/local/bin/kms-operator
USER 65532:65532
EXPOSE 8443 8081
ENTRYPOINT ["/usr/local/bin/kms-operator"]
CMD ["run"]
