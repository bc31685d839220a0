# Cortiq Serve image. The multi-stage build with a runtime stage that carries
# only the two binaries and the embedded model arrives with the deploy issue;
# this stage builds and tests the project exactly as CI does.
FROM debian:bookworm AS build
WORKDIR /src
COPY . .
RUN bash scripts/bootstrap.sh && bash scripts/test.sh --quick
