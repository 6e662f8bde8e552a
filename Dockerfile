# coderun operator image (`coderun-operator`: kopf with coderun's handlers), for
# users with Docker. The local cluster builds the same content without Docker or
# a registry: e2e/images/build.sh operator (recipe e2e/images/recipes/operator.sh).
# Build from the repository root:
#   docker build -t coderun.local/operator:v1 .
#
# The pod runs it as 65532:65532 with a read-only root filesystem and /tmp
# writable (an emptyDir): nothing here writes anywhere else at run time.

# Debian's Python 3.11 and venv, slimmed like the sandbox images: no apt lists or
# caches, no man pages, locales or docs (copyright files stay), no library test
# suites. The user "coderun" (65532:65532) has /tmp as its home.
# Byte-code is compiled at build time as unchecked-hash .pyc: the root filesystem
# is read-only at run time, so Python could not write any; an image's files do
# not change under it, so there is nothing to check against (and the
# registry-free build gives every file the same mtime, which would make
# timestamp-checked .pyc files stale).
FROM debian:bookworm-slim AS base
RUN apt-get update \
 && apt-get install -y --no-install-recommends python3 python3-venv ca-certificates \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/* /usr/share/man/* /usr/share/info/* /usr/share/locale/* \
 && find /usr/lib/python3/dist-packages -depth -type d -name tests -exec rm -rf {} + \
 && find /usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete \
 && find /usr/share/doc -mindepth 1 -type d -empty -delete \
 && echo 'coderun:x:65532:65532:coderun:/tmp:/usr/sbin/nologin' >>/etc/passwd \
 && echo 'coderun:x:65532:' >>/etc/group \
 && python3 -m compileall -q -f --invalidation-mode unchecked-hash -x '/lib2to3/tests/' \
        /usr/lib/python3.11 /usr/lib/python3/dist-packages

# The venv, built in a stage of its own so that pip and setuptools, which only
# the build needs, stay out of the image.
FROM base AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
# First the third-party dependencies, in a layer that only a change to
# pyproject.toml or the lock rebuilds: its `dependencies` and its `operator`
# extra at the versions requirements/operator.txt pins, wheels only (there is
# no compiler in the image).
COPY pyproject.toml requirements/operator.txt /tmp/build/
RUN python3 -m venv /opt/coderun/venv \
 && python3 -c 'import sys, tomllib; project = tomllib.load(open(sys.argv[1], "rb"))["project"]; print(*project["dependencies"], *project["optional-dependencies"]["operator"], sep="\n")' \
        /tmp/build/pyproject.toml >/tmp/build/requirements.txt \
 && /opt/coderun/venv/bin/pip install --only-binary=:all: -c /tmp/build/operator.txt -r /tmp/build/requirements.txt \
 && rm -rf /tmp/build
# Then coderun itself, `.[operator]`: its dependencies are in place, so only
# setuptools (to build it) is downloaded.
COPY pyproject.toml README.md /tmp/build/
COPY src /tmp/build/src
RUN /opt/coderun/venv/bin/pip install '/tmp/build[operator]' \
 && /opt/coderun/venv/bin/python -m pip uninstall -y pip setuptools \
 && python3 -m compileall -q -f --invalidation-mode unchecked-hash /opt/coderun/venv/lib \
 && rm -rf /tmp/build

FROM base
COPY --from=build /opt/coderun/venv /opt/coderun/venv
ENV PATH=/opt/coderun/venv/bin:/usr/local/bin:/usr/bin:/bin LANG=C.UTF-8 \
    PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 65532:65532
WORKDIR /tmp
# The handlers and the native dependencies import as the operator's user, and
# the entry point runs.
RUN python -c 'import coderun.controlplane.handlers, kopf, re2, cryptography' \
 && coderun-operator --help >/dev/null
# 8080: liveness (/healthz; CODERUN_LIVENESS moves it); 9108: Prometheus
# metrics (CODERUN_METRICS_PORT); 9443: the validating webhook, served when
# CODERUN_WEBHOOK_PORT is set (to 9443).
EXPOSE 8080 9108 9443
ENTRYPOINT ["/opt/coderun/venv/bin/coderun-operator"]
