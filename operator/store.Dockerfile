# coderun's embedded S3 store image (the chart's store.embedded, docs/data.md): Versity's S3 gateway, versitygw,
# one static binary (CGO_ENABLED=0) built from its Go module, serving a directory with its posix backend (a bucket
# is a directory, an object a file, its metadata extended attributes: the volume needs xattrs). For users with
# Docker; the local cluster builds the same content without Docker or a registry: e2e/images/build.sh store
# (recipe e2e/images/recipes/store.sh; the version is e2e/cluster/versions.sh's VERSITYGW_VERSION).
# Build from the repository root:
#   docker build -f operator/store.Dockerfile -t registry.example.com/coderun/store:v1 .
FROM golang:1.26-bookworm AS build
ARG VERSITYGW_VERSION=v1.8.0
RUN CGO_ENABLED=0 GOFLAGS=-buildvcs=false go install -ldflags "-s -w" \
      "github.com/versity/versitygw/cmd/versitygw@${VERSITYGW_VERSION}"

FROM scratch
COPY --from=build /go/bin/versitygw /usr/local/bin/versitygw
COPY --chown=65532:65532 --from=build /tmp /data
USER 65532:65532
WORKDIR /data
ENTRYPOINT ["/usr/local/bin/versitygw"]
