# coderun egress proxy image (docs/egress.md): Debian bookworm's squid-openssl
# (squid 5 built with OpenSSL: it peeks at a TLS ClientHello) with the
# security archive's fixes, openssl, and coderun's helpers (src/coderun/egress,
# standard library only) run by Debian's python3. For users with Docker; the
# local cluster builds the same content without Docker or a registry:
# e2e/images/build.sh egress-proxy (recipe e2e/images/recipes/egress-proxy.sh).
# Build from the repository root:
#   docker build -f operator/egress-proxy.Dockerfile -t coderun.local/egress-proxy:v1 .
#
# The chart runs it as 65532:65532 with a read-only root: squid's runtime files
# (squid.conf, its pid, the TLS pair, the logs, the revocation list) go to
# /run/coderun-egress (an emptyDir), the keys (a Secret) are mounted read-only
# at /etc/coderun-egress/keys. The same image runs the pod's second container,
# the admin endpoint (coderun-egress-proxy admin).
FROM debian:bookworm-slim
# Installing squid must not start it in the build (its postinst would):
# policy-rc.d says no. squid's own configuration and service files are never
# used (the entrypoint renders squid.conf).
RUN printf '#!/bin/sh\nexit 101\n' >/usr/sbin/policy-rc.d && chmod 0755 /usr/sbin/policy-rc.d \
 && apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get -y upgrade \
 && DEBIAN_FRONTEND=noninteractive apt-get -y install --no-install-recommends squid-openssl openssl python3 \
 && rm -f /usr/sbin/policy-rc.d \
 && rm -rf /etc/squid/* /etc/init.d/squid /etc/logrotate.d/squid \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/* /var/log/* /usr/share/man/* /usr/share/info/* /usr/share/locale/* \
 && find /usr/share/doc -mindepth 1 ! -type d ! -name copyright -delete \
 && find /usr/share/doc -mindepth 1 -type d -empty -delete \
 && echo 'egress:x:65532:65532:egress:/tmp:/usr/sbin/nologin' >>/etc/passwd \
 && echo 'egress:x:65532:' >>/etc/group \
 && python3 -m compileall -q -f --invalidation-mode unchecked-hash /usr/lib/python3.11

# The helpers, precompiled (the root is read-only at run time), and the
# launchers and error pages they write.
COPY src/coderun/__init__.py /opt/coderun-egress/coderun/__init__.py
COPY src/coderun/egress /opt/coderun-egress/coderun/egress
RUN find /opt/coderun-egress -name __pycache__ -prune -exec rm -rf {} + \
 && python3 -m compileall -q -f --invalidation-mode unchecked-hash /opt/coderun-egress \
 && python3 -I -c "import sys; sys.path.insert(0, '/opt/coderun-egress'); \
from coderun.egress.squid_config import write_error_pages, write_launchers; \
write_launchers('/usr/local/lib/coderun-egress/bin', '/usr/bin/python3', '/opt/coderun-egress'); \
write_error_pages('/usr/local/lib/coderun-egress/errors')" \
 && mkdir -p /run/coderun-egress /etc/coderun-egress/keys

ENV PATH=/usr/local/bin:/usr/sbin:/usr/bin:/bin LANG=C.UTF-8
USER 65532:65532
WORKDIR /tmp
# As the proxy's user: squid accepts the squid.conf the entrypoint renders
# (squid -k parse; nothing listens).
RUN CODERUN_EGRESS_STATE=/tmp/verify python3 -I -c "import os, sys; sys.path.insert(0, '/opt/coderun-egress'); \
from coderun.egress.proxy import prepare, settings_from; prepare(settings_from(os.environ))" \
 && { squid -k parse -f /tmp/verify/squid.conf >/tmp/verify/parsed 2>&1 || { cat /tmp/verify/parsed; exit 1; }; } \
 && if grep -E 'FATAL|ERROR|is ignored' /tmp/verify/parsed; then exit 1; fi \
 && rm -rf /tmp/verify
# 3128: the proxy (sandbox pods only); 3130: the admin endpoint (the operator only).
EXPOSE 3128 3130
ENTRYPOINT ["/usr/local/lib/coderun-egress/bin/coderun-egress-proxy", "start"]
