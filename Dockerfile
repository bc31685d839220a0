# Cortiq Serve image: cortiq-server + the cortiq client + the embedded model.
#
#   docker build -t cortiq-serve .
#   docker run --rm -p 50051:50051 -p 9464:9464 cortiq-serve [EXTRA SERVER FLAGS]
#   buildah bud --format docker -t cortiq-serve .   # buildah: docker format keeps the HEALTHCHECK
#
# tests/deploy/image_test.sh builds it with buildah and runs a generation in it
# (deploy/README.md, "The image": build time, size, and the base image made
# with debootstrap where Docker Hub is out of reach).
#
# Two stages. `build` installs the toolchain through scripts/bootstrap.sh (the
# project's one package list; CORTIQ_BOOTSTRAP_MINIMAL=1 leaves out the test,
# Python and tooling extras) and builds the two binaries with CMake/Ninja, tests
# off. `runtime` is debian:bookworm with only the shared libraries the binaries
# link (tests/deploy/dockerfile_test.py checks this list against `ldd` +
# `dpkg -S` of the built binaries), the binaries in /usr/bin and the model in
# /usr/share/cortiq/model, where cortiq-server looks by default
# (<exe>/../share/cortiq/model, server/config.cc DefaultModelDir).
# deploy/README.md: compose, Kubernetes, drain.

FROM debian:bookworm AS build
ENV DEBIAN_FRONTEND=noninteractive CORTIQ_BOOTSTRAP_MINIMAL=1
WORKDIR /src
# The package layer first, so that a source change does not reinstall it.
COPY scripts/bootstrap.sh scripts/bootstrap.sh
RUN bash scripts/bootstrap.sh && rm -rf /var/lib/apt/lists/*
COPY CMakeLists.txt ./
COPY proto proto
COPY core core
COPY server server
COPY client client
COPY tools tools
COPY models models
RUN test -f models/cortiq-byte-4m/config.json || \
      { echo "models/cortiq-byte-4m is missing: the image serves the embedded model" >&2; exit 1; }
# Runtime CPU dispatch (CORTIQ_NATIVE=OFF): the image runs on any x86-64.
# CORTIQ_BUILD_JOBS (--build-arg): parallel compile jobs; empty: ninja's default.
ARG CORTIQ_BUILD_JOBS=
RUN cmake -S . -B /build -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo \
      -DCORTIQ_BUILD_TESTS=OFF -DCORTIQ_NATIVE=OFF \
 && cmake --build /build ${CORTIQ_BUILD_JOBS:+-j "$CORTIQ_BUILD_JOBS"} --target cortiq-server cortiq \
 && mkdir -p /out/bin \
 && objcopy --strip-debug /build/server/cortiq-server /out/bin/cortiq-server \
 && objcopy --strip-debug /build/client/cortiq /out/bin/cortiq

FROM debian:bookworm AS runtime
# Every shared library of cortiq-server and cortiq outside the base image
# (libc6, libstdc++6, libgcc-s1, zlib1g are in debian:bookworm already).
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      libabsl20220623 \
      libbrotli1 \
      libc-ares2 \
      libcivetweb1 \
      libcpp-httplib0.11 \
      libfmt9 \
      libgrpc++1.51 \
      libgrpc29 \
      libprometheus-cpp-core1.0 \
      libprometheus-cpp-pull1.0 \
      libprotobuf32 \
      libre2-9 \
      libspdlog1.10 \
      libssl3 \
 && rm -rf /var/lib/apt/lists/*
RUN groupadd --system --gid 10001 cortiq \
 && useradd --system --uid 10001 --gid cortiq --home-dir /nonexistent --no-create-home \
      --shell /usr/sbin/nologin cortiq \
 && install -d -o 10001 -g 10001 -m 0750 /var/lib/cortiq /var/lib/cortiq/state
COPY --from=build /out/bin/cortiq-server /out/bin/cortiq /usr/bin/
COPY --from=build /src/models/cortiq-byte-4m /usr/share/cortiq/model
# /var/lib/cortiq/state: where deploy/compose.yaml and deploy/k8s mount the
# session state volume (--state-dir; off unless given). Owned by the user, so
# a new Docker named volume mounted there starts with that owner (Docker
# copies the folder's ownership into an empty volume); Kubernetes makes its
# volume writable through the pod's fsGroup instead.
USER 10001:10001
EXPOSE 50051 8080 9464
# grpc.health.v1 through the client: exit 0 only when SERVING (a draining node
# reports NOT_SERVING and turns unhealthy on purpose).
HEALTHCHECK --interval=10s --timeout=5s --start-period=30s --retries=3 \
  CMD ["/usr/bin/cortiq", "--server", "127.0.0.1:50051", "--timeout", "3", "health"]
# SIGTERM drains: NOT_SERVING, new work UNAVAILABLE, streams get --grace, kept
# sessions migrate (same ids) to --peers / --peer-dns within --drain-timeout, exit 0
# (nonzero if one could not move). The exit comes at most
# --grace + --drain-timeout + 10 s after the signal (defaults: 10 + 60 + 10 =
# 80 s): give `docker stop --time` / compose stop_grace_period that much.
STOPSIGNAL SIGTERM
# Secure by default: on 0.0.0.0 the server refuses to start without a
# token. Give it from a secret: a roles file (--auth-tokens FILE, with a
# peer-role --peer-token, as deploy/compose.yaml and deploy/k8s do; made by
# deploy/make-tokens.sh) or one admin token (CORTIQ_AUTH_TOKEN, or
# --auth-token-file FILE). --insecure serves without one (a trusted network
# only). /metrics stays unauthenticated.
# The OpenAI-compatible HTTP API (same tokens, Authorization: Bearer) on 8080.
ENTRYPOINT ["/usr/bin/cortiq-server", "--listen", "0.0.0.0:50051", "--http-listen", "0.0.0.0:8080", "--metrics-listen", "0.0.0.0:9464"]
# Extra flags are appended (docker run IMAGE --peers ..., compose `command`,
# Kubernetes `args`); a repeated flag takes its last value.
CMD []
