"""squid.conf for the egress proxy, rendered from one set of settings: the proxy image's entrypoint and the local
test tier render it the same way (tests/egress), so what the tests prove is what the pod runs.

One squid, two stages, because squid 5 answers a refused CONNECT on a TLS-peeking (ssl-bump) port by bumping the
client connection to show its error page inside TLS: the client sees "200 Connection established" and then a
certificate it cannot trust, never the refusal. So:
- the policy stage (`listen`, what runs use) peeks at nothing: it checks the credential, the name, the port and
  the addresses, and refuses with a plain 403 whose body and X-Coderun-Refused header name the host and the
  policy; an allowed CONNECT goes on, through coderun's tunnel relay (relay.py: a run's byte budget and its
  credential's revocation cut its tunnels), to
- the TLS stage (a loopback port of the same squid, as its parent peer), which checks everything again (cache
  hits), peeks at the ClientHello (never decrypts), splices the tunnel if its server name (SNI) is the CONNECT
  host and closes it otherwise, and is the one that connects.
Plain http:// requests are checked and forwarded by the policy stage itself. With an upstream proxy (Upstream: a
corporate proxy), the stage that would connect hands the request to it instead, and squid never connects itself.

The checks, in order (http_access below):
1. no valid credential (the auth helper): 407, and squid asks again;
2. more connections from one client (a run's pod) than MAX_CONNECTIONS_PER_CLIENT: refused, so one run cannot
   starve the others;
3. anything but CONNECT and plain http:// (ftp://, https:// for squid to fetch itself): refused;
4. the acl helper: the name and port must be allowed by a host rule of the run, and every address the name
   resolves to must lie outside the protected ranges unless a CIDR rule of the run covers it;
5. squid's own check of the addresses it resolved (`dst`), with the lookup it connects with: the proxy itself
   (its loopback, "this host") is refused whatever the helper found, since no rule of a run opens the proxy's
   own ports; the other protected ranges unless the helper found a CIDR rule covering them.
"""
from __future__ import annotations

import ipaddress
import os
import re
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Sequence
from urllib.parse import quote

from .ranges import Network, protected_networks
from .run_logs import runs_dir

MAX_CONNECTIONS_PER_CLIENT = 64
ACL_KEY = "%ul %credentials %>rd %>rP %ssl::>sni"  # what the acl helper is asked, before the check's name
# The addresses that are the proxy pod itself (its admin port, its TLS stage): no run's CIDR rule opens them.
PROXY_ITSELF = ("127.0.0.0/8", "::1/128", "0.0.0.0/8", "::/128")
DENIED_PAGE = "ERR_CODERUN_DENIED"
# Squid marks its TLS stage dead when its first look at it comes before the port listens (it does, at start), and
# looks again only when a request needs it. A request for this name from the proxy's own host goes straight to
# the TLS stage (which refuses it: no credential), so wait_ready() can wake it up and see it answer.
WARMUP_HOST = "coderun-egress-warmup.invalid"
XID_HEADER = "X-Coderun-Xid"  # the policy stage's transaction id, sent to the TLS stage to pair their log lines
# The access log's line (access_log.py reads it back): (record key, squid logformat code), in order.
FIELDS = (
    ("time", "%ts.%03tu"),
    ("duration_ms", "%tr"),
    ("client", "%>a"),
    ("user", "%#un"),
    ("run", "%#{run}note"),
    ("uid", "%#{uid}note"),  # set by the acl helper only once the run's credential verified
    ("policy", "%#{policy}note"),
    ("method", "%#>rm"),
    ("host", "%#>rd"),
    ("port", "%>rP"),
    ("path", "%#>rp"),
    ("status", "%>Hs"),
    ("squid_status", "%Ss"),
    ("bytes_sent", "%>st"),
    ("bytes_received", "%<st"),
    ("server", "%<a"),
    ("sni", "%#ssl::>sni"),
    ("tls", "%ssl::bump_mode"),
    ("rule", "%#{rule}note"),
    ("reason", "%#{reason}note"),
    ("message", "%#{message}note"),
    ("error", "%err_code"),
    ("stage", "%{stage}note"),
    ("xid", "%master_xaction"),
    ("pair", f"%#>h{{{XID_HEADER}}}"),
    ("hierarchy", "%Sh"),
)
LOGFORMAT = " ".join(code for _, code in FIELDS)
# Helper programs squid starts (launchers written by write_launchers, in the image and in the test tier alike).
AUTH, ACL, LOG, PROXY = "coderun-egress-auth", "coderun-egress-acl", "coderun-egress-log", "coderun-egress-proxy"


@dataclass(frozen=True)
class Upstream:
    """A parent proxy every request leaves through (a corporate proxy), with an optional Basic login of the proxy's
    own. The password is written only into squid.conf, in the pod's emptyDir (mode 0600): never into the
    environment (squid's helpers inherit it), an argument, or a log."""
    host: str
    port: int
    username: str = ""
    password: str = ""

    def __post_init__(self) -> None:
        if not UPSTREAM_HOST.fullmatch(self.host):
            raise ValueError(f"the upstream proxy's host is not a name or an address: {self.host[:80]!r}")
        if not 0 < self.port < 65536:
            raise ValueError(f"the upstream proxy's port is not a port: {self.port}")
        if bool(self.username) != bool(self.password):
            raise ValueError("the upstream proxy's login needs both a username and a password")
        # Squid reads `login=*:...` as "the client's user name" and a colon ends Basic's user name.
        if self.username.startswith("*") or ":" in self.username:
            raise ValueError("the upstream proxy's username may neither start with * nor hold a colon")

    def cache_peer(self) -> str:
        """The cache_peer line. No login=PASS: a run's credential (its Proxy-Authorization) never goes upstream;
        squid sends this login instead. login= is URL-unescaped by squid, so every byte but [A-Za-z0-9_.~-] is
        %-escaped: no space, quote or % of the password can end the token or change its meaning."""
        login = f" login={quote(self.username, safe='')}:{quote(self.password, safe='')}" if self.username else ""
        return (f"cache_peer {self.host} parent {self.port} 0 no-query no-digest no-netdb-exchange default "
                f"name={UPSTREAM_PEER}{login}")


# A DNS name or an IPv4/IPv6 address, as cache_peer takes it (no brackets, no port).
UPSTREAM_HOST = re.compile(r"[A-Za-z0-9]([-A-Za-z0-9.]{0,251}[A-Za-z0-9])?|[0-9A-Fa-f:.]{2,45}")
UPSTREAM_PEER = "upstream"


@dataclass(frozen=True)
class Settings:
    listen: str                 # e.g. 0.0.0.0:3128 in the pod, 127.0.0.1:PORT in tests
    tls_stage_port: int         # on 127.0.0.1; nothing else may listen there
    state_dir: str              # writable (an emptyDir): pid file, TLS pair, access log
    launchers: str              # where write_launchers put the helper programs
    keys_dir: str               # the signing keys (a Secret, mounted)
    revocations: str            # the revocation list (a ConfigMap key, mounted)
    error_dir: str              # write_error_pages' directory
    hosts_file: str = "/etc/hosts"
    # squid's own log; `squid -N -d 1` (proxy.py) also prints its errors to stderr, the container's log. Not
    # stdio:/dev/stderr: squid reopens that path, which a non-root uid may not do to the runtime's pipe.
    cache_log: str = ""
    env: Mapping[str, str] = field(default_factory=dict)  # the cluster's ranges (ranges.py)
    admin_listen: str = "127.0.0.1:0"  # the admin endpoint's (admin.py), in its own container
    helper_workers: int = 8
    relay_port: int = 3131      # the tunnel relay's (relay.py), on 127.0.0.1: the policy stage's parent peer
    pod_name: str = ""  # this proxy pod's (the downward API): the helpers refuse a credential for another pod
    # The ports at which the proxy's own addresses (PROXY_ITSELF) are refused; none: every port (the pod, whose
    # loopback is the proxy's alone). The test tier, whose origins share the proxy's loopback, names its own.
    proxy_itself_ports: tuple[int, ...] = ()
    # A corporate proxy every request leaves through instead of connecting itself (None: squid connects directly).
    upstream: Upstream | None = None

    @property
    def access_log(self) -> str:
        return os.path.join(self.state_dir, "access.jsonl")

    @property
    def runs_dir(self) -> str:
        return runs_dir(self.state_dir)

    @property
    def tls_pair(self) -> str:
        return os.path.join(self.state_dir, "tls.pem")


def render(s: Settings) -> str:
    files = f"--keys {s.keys_dir} --revocations {s.revocations}" + (f" --pod {s.pod_name}" if s.pod_name else "")
    def helper(key: str) -> str:
        return (f"children-max=4 children-startup=1 children-idle=1 concurrency={s.helper_workers * 4} "
                f"{key} %DATA {s.launchers}/{ACL} {files} --hosts-file {s.hosts_file} "
                f"--runs {s.runs_dir} --workers {s.helper_workers}")
    protected = " ".join(str(net) for net in disjoint([net for _, net in protected_networks(s.env)]))
    lines = [
        "# Generated by coderun.egress.squid_config. Do not edit: change the settings it is rendered from.",
        f"http_port {s.listen} name=policy",
        # ssl-bump only to peek at the ClientHello; the certificate is never shown (nothing is bumped).
        f"http_port 127.0.0.1:{s.tls_stage_port} name=tls ssl-bump tls-cert={s.tls_pair} "
        "generate-host-certificates=off",
        "visible_hostname coderun-egress",
        "httpd_suppress_version_string on",
        f"pid_filename {s.state_dir}/squid.pid",
        f"coredump_dir {s.state_dir}",
        f"cache_log {s.cache_log or os.path.join(s.state_dir, 'cache.log')}",
        f"error_directory {s.error_dir}",
        f"hosts_file {s.hosts_file}",
        "cache deny all",
        "cache_mem 8 MB",
        "netdb_filename none",
        "pinger_enable off",
        "logfile_rotate 0",
        "shutdown_lifetime 2 seconds",
        # Nothing of the run leaks upstream: no client address, no Via; squid drops Proxy-Authorization itself.
        "forwarded_for delete",
        "via off",
        # A credential of a policy's 64 longest rules is about 21 KB, 28 KB as a Basic header.
        "request_header_max_size 64 KB",
        "connect_timeout 10 seconds",
        "request_timeout 30 seconds",
        # The minimum time squid keeps a name's addresses (negative_dns_ttl is also the positive minimum): the
        # address it checks (`dst`) is the address it connects to, however short the TTL a DNS server gives.
        "negative_dns_ttl 30 seconds",
        "",
        "acl at_policy myportname policy",
        "acl at_tls myportname tls",
        "acl stage_policy annotate_transaction stage=policy",
        "acl stage_tls annotate_transaction stage=tls",
        f"acl warmup_host dstdomain {WARMUP_HOST}",
        "acl warmup all-of localhost warmup_host",
        # The TLS stage is this squid's own parent, through the tunnel relay (relay.py: it counts a tunnel's bytes
        # against the run's budget as they flow, and closes it when the run's credential is revoked): login=PASS
        # hands both the run's credential (the TLS stage checks it again).
        f"cache_peer 127.0.0.1 parent {s.relay_port} 0 no-query no-digest no-netdb-exchange login=PASS "
        "name=tls_stage",
        "cache_peer_access tls_stage allow at_policy CONNECT",
        "cache_peer_access tls_stage allow at_policy warmup",
        "cache_peer_access tls_stage deny all",
        "never_direct allow at_policy CONNECT",
        "never_direct allow at_policy warmup",
        *upstream_lines(s.upstream),
        f"request_header_access {XID_HEADER} deny all",
        f'request_header_add {XID_HEADER} "%master_xaction" at_policy CONNECT',
        "",
        f"logformat coderun {LOGFORMAT}",
        f"logfile_daemon {s.launchers}/{LOG}",
        f"access_log daemon:{s.access_log} coderun",
        "",
        f"auth_param basic program {s.launchers}/{AUTH} {files}",
        "auth_param basic children 4 startup=1 idle=1 concurrency=64",
        "auth_param basic realm coderun-egress",
        "auth_param basic casesensitive on",
        # Squid re-asks the auth helper this often; the budget check, asked on every request and never cached,
        # refuses a revoked or expired token at once.
        "auth_param basic credentialsttl 5 seconds",
        "authenticate_ttl 5 seconds",
        # One helper program for every check; the acl lines' argument (%DATA) says which. Answers on names are kept
        # 5 seconds; the budget's never (ttl=0 caches nothing), so a run is stopped at its budget, not 5 s after.
        # The budget check counts every request (run_logs.admit), so its key is the request's own transaction id:
        # squid hands a check whose key is already being looked up the pending answer, and concurrent identical
        # requests of a flood would be counted once (seen: 256 of 3,600).
        f"external_acl_type coderun ttl=5 negative_ttl=5 {helper(ACL_KEY)}",
        f"external_acl_type coderun_budget ttl=0 negative_ttl=0 {helper(ACL_KEY + ' %master_xaction')}",
        "",
        "acl authenticated proxy_auth REQUIRED",
        f"acl crowded maxconn {MAX_CONNECTIONS_PER_CLIENT}",
        "acl plain_http proto HTTP",
        "acl allowed_by_policy external coderun request",
        "acl within_budget external coderun_budget budget",
        "acl via_cidr note via_cidr yes",
        f"acl protected dst {protected}",
        f"acl proxy_itself dst {' '.join(PROXY_ITSELF)}",
        *([f"acl proxy_itself_port port {' '.join(map(str, s.proxy_itself_ports))}"] if s.proxy_itself_ports else []),
        "acl refused note reason",
        "acl step1 at_step SslBump1",
        "acl sni_is_host external coderun sni",
        "",
        # The first two lines only annotate (they never match): which stage logged a line.
        "http_access deny at_policy !stage_policy",
        "http_access deny at_tls !stage_tls",
        "http_access allow at_policy warmup",
        # 407 only when the credential is missing or refused. The other refusals end in `all`: squid answers a
        # line whose last acl needs the user name (the helper's %ul) with 407, asking for another password.
        "http_access deny !authenticated",
        "http_access deny at_policy crowded all",
        "http_access deny !CONNECT !plain_http all",
        # At the policy stage only (a CONNECT's TLS stage is the same request), and before the names: the budget
        # check counts each request of the run's as it asks, allowed or refused by the policy after it, as the
        # run's status counts them.
        "http_access deny at_policy !within_budget all",
        "http_access deny !allowed_by_policy all",
        # squid's own lookup, the one it connects with, checked again whatever the helper found: a name whose answer
        # changed since the helper's lookup reaches neither the proxy's own ports nor an uncovered protected range.
        f"http_access deny proxy_itself {'proxy_itself_port ' if s.proxy_itself_ports else ''}all",
        "http_access deny protected !via_cidr all",
        "http_access allow all",
        f"deny_info {DENIED_PAGE} all",
        # The refusal in a header too: an HTTP client reports a CONNECT's status, rarely its body.
        "reply_header_add X-Coderun-Refused \"%'{message}note\" refused",
        "",
        "ssl_bump peek step1",
        "ssl_bump splice sni_is_host",
        "ssl_bump terminate all",
    ]
    return "\n".join(lines) + "\n"


def upstream_lines(upstream: Upstream | None) -> list[str]:
    """Everything leaves through the upstream proxy: the TLS stage's spliced tunnels (squid sends the parent a
    CONNECT for the name the run asked for) and the policy stage's plain http:// requests. A CONNECT at the policy
    stage still goes to the TLS stage first (through the relay, which counts its bytes and cuts it on revocation),
    so the checks, the per-request log and the budgets are the same as without it."""
    if upstream is None:
        return []
    return [
        upstream.cache_peer(),
        f"cache_peer_access {UPSTREAM_PEER} deny at_policy CONNECT",
        f"cache_peer_access {UPSTREAM_PEER} deny warmup",
        f"cache_peer_access {UPSTREAM_PEER} allow all",
        "never_direct allow all",
    ]


# The page of every refusal in http_access: the helper's message (%o) when it gave one. Squid sends it as the
# 403's body; a program (or the agent behind it) reads what to change.
DENIED_TEXT = ("coderun egress proxy: request refused.\n%o\n"
               "Squid said: %E (destination %H).\n")


def disjoint(networks: Sequence[Network]) -> list[Network]:
    """The same addresses as ranges that neither overlap nor touch: squid keeps only the smaller of two nested
    ranges in one acl (it warns and drops the larger, fc00::/7 beside fd00:ec2::254), so nesting would open a hole."""
    return [net for version in (4, 6)
            for net in ipaddress.collapse_addresses(n for n in networks if n.version == version)]


def write_error_pages(directory: str, squid_templates: str = "/usr/share/squid/errors/templates") -> None:
    """squid's own English templates, plus the coderun refusal page (error_directory needs them all)."""
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    for template in Path(squid_templates).iterdir():
        shutil.copyfile(template, out / template.name)
    (out / DENIED_PAGE).write_text(DENIED_TEXT)


def write_launchers(directory: str, python: str, package_root: str) -> None:
    """Tiny executables for squid to start (logfile_daemon takes a program, not a command line) and for the image's
    entrypoint and probe: each runs one entry point of this package with `python -I` and `package_root` (where
    coderun/egress lives) as the only path besides the standard library."""
    entries = {AUTH: ("helpers", "['auth']"), ACL: ("helpers", "['acl']"), LOG: ("access_log", "[]"),
               PROXY: ("proxy", "[]")}
    Path(directory).mkdir(parents=True, exist_ok=True)
    for program, (module, first) in entries.items():
        path = Path(directory) / program
        path.write_text(f"#!{python} -I\nimport sys\nsys.path.insert(0, {package_root!r})\n"
                        f"from coderun.egress.{module} import main\nmain({first} + sys.argv[1:])\n")
        path.chmod(0o755)
