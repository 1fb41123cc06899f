# forkd in a container: `forkd serve` with its home (database and socket) on a volume.
FROM rust:1.95-bookworm AS build
WORKDIR /src
COPY . .
RUN cargo build --release --locked --bin forkd --bin forkctl

FROM debian:bookworm-slim
# The anthropic and openai providers verify TLS against the system's roots.
RUN apt-get update \
    && apt-get install -y --no-install-recommends ca-certificates \
    && rm -rf /var/lib/apt/lists/*
RUN useradd --system --create-home --home-dir /var/lib/forkd forkd
COPY --from=build /src/target/release/forkd /src/target/release/forkctl /usr/local/bin/
USER forkd
ENV FORKD_HOME=/var/lib/forkd \
    FORKD_ADDR=unix:///var/lib/forkd/forkd.sock \
    RUST_LOG=info
VOLUME ["/var/lib/forkd"]
# The Unix socket lives on the volume: clients in other containers mount it too.
ENTRYPOINT ["forkd"]
CMD ["serve"]
