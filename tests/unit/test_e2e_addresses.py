"""The e2e tier stays on this machine, and its modules share helpers through e2e/framework/ (issue 36).

A containment test that dials a public address sends a packet off the machine when the sandbox leaks, and
passes without meaning when that address is simply unreachable. So no file under e2e/ or tests/egress/ may name
an IP address outside the cluster's ranges (read from e2e/cluster/cluster.sh), loopback, link-local scope and
the stand-ins the harness binds on the node (e2e/cluster/standins.py, the one list), nor a URL or lookup of a
host outside the test and cluster domains.
"""
from __future__ import annotations

import ast
import importlib.util
import ipaddress
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
SCANNED = ("e2e", "tests/egress")
# A record of Debian package versions (1.2.3.4 is a version there), not code or configuration.
NOT_SCANNED_SUFFIXES = (".packages.lock",)
HOST_SUFFIXES = (".test", ".local", "localhost")

IPV4 = re.compile(r"(?<![\w.])(\d{1,3}(?:\.\d{1,3}){3})(/\d{1,2})?(?!\.?\d)")
IPV6 = re.compile(r"(?<![\w:.])([0-9a-fA-F]{1,4}(?::[0-9a-fA-F]{0,4}){2,7})(/\d{1,3})?(?![\w:])")
URL_HOST = re.compile(r"\b(?:https?|ftp)://([^/\s\"'\\:?#)\]]+)")
LOOKUP_HOST = re.compile(r"(?:getaddrinfo|gethostbyname|create_connection)\(\(?[\"']([^\"']+)[\"']")


def standins():
    spec = importlib.util.spec_from_file_location("standins", REPO / "e2e/cluster/standins.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def allowed_networks() -> list:
    cluster = (REPO / "e2e/cluster/cluster.sh").read_text()
    ranges = [re.search(rf"^{name}=(\S+)", cluster, re.M).group(1) for name in ("POD_CIDR", "SERVICE_CIDR")]
    ranges += ["127.0.0.0/8", "::1/128",  # loopback
               "0.0.0.0/32", "::/128",  # "any address", to bind to
               "fe80::/10", "ff02::/16",  # link-local scope: never routed off the link
               # test_network's two namespaces plugged into the pod bridge: addresses it gives them itself.
               "192.168.251.0/24", "fd99:88::/64"]
    ranges += [ipaddress.ip_network(a) for a in standins().ADDRESSES]
    return [ipaddress.ip_network(r) for r in ranges]


# A default route names no destination.
DEFAULT_ROUTES = {ipaddress.ip_network("0.0.0.0/0"), ipaddress.ip_network("::/0")}


def _outside(literal: str, prefix: str | None, allowed: list) -> bool:
    try:
        network = ipaddress.ip_network(literal + (prefix or ""), strict=False)
    except ValueError:
        return False  # not an address (a version, a time)
    if network in DEFAULT_ROUTES:
        return False
    return not any(network.version == a.version and network.subnet_of(a) for a in allowed)


def _foreign_host(host: str) -> bool:
    host = host.split("%")[0]  # a percent-encoded tail (a CRLF-injection probe) is not part of the name
    if "{" in host or "." not in host or host.strip(".") == "" or host.replace(".", "").isdigit():
        return False  # formatted in, a cluster search-path name, a placeholder, or an address (checked above)
    return not host.rstrip(".").endswith(HOST_SUFFIXES)


def problems_in(text: str, allowed: list, python: bool) -> list[str]:
    found = [m.group(0) for pattern in (IPV4, IPV6) for m in pattern.finditer(text)
             if _outside(m.group(1), m.group(2), allowed)]
    if python:
        found += [m.group(1) for pattern in (URL_HOST, LOOKUP_HOST) for m in pattern.finditer(text)
                  if _foreign_host(m.group(1))]
    return found


def scanned_files():
    for root in SCANNED:
        for path in sorted((REPO / root).rglob("*")):
            if path.is_file() and not path.name.endswith(NOT_SCANNED_SUFFIXES) and "__pycache__" not in path.parts:
                yield path


def test_no_e2e_file_names_an_address_or_host_off_this_machine():
    allowed = allowed_networks()
    problems = {}
    for path in scanned_files():
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        found = problems_in(text, allowed, python=path.suffix == ".py")
        if found:
            problems[str(path.relative_to(REPO))] = sorted(set(found))
    assert not problems, f"addresses or hosts off this machine (use e2e/cluster/standins.py's): {problems}"


@pytest.mark.parametrize("text", ['tcp("1.1.1.1", 443)', 'tcp("2001:4860:4860::8888", 53)', "dst 8.8.8.0/24",
                                  'socket.getaddrinfo("example.com", 443)', 'urlopen("https://pypi.org/simple")',
                                  'egress: [{cidr: 2001:db8::/32}]'])
def test_the_scan_flags_a_public_address_or_host(text):
    """The positive control: the check above would catch what it exists for."""
    assert problems_in(text, allowed_networks(), python=True), text


@pytest.mark.parametrize("text", ['tcp("198.51.100.1", 443)', 'tcp("2001:db8::1", 443)', "ping 10.88.0.1",
                                  "10.96.0.10", "169.254.169.254/32", 'getaddrinfo("example.coderun.test", 80)',
                                  "http://web.ns.svc.cluster.local/", "127.0.0.1:8080", "ff02::1", "x[1:2:3]",
                                  "version 1.2.3", "12:30:45", "0.0.0.0/0", "http://{dest.name()}/"])
def test_the_scan_passes_the_cluster_loopback_and_the_stand_ins(text):
    assert not problems_in(text, allowed_networks(), python=True), text


def test_the_stand_ins_are_not_routed_anywhere_but_here():
    """What standins.py declares must be an address no real service would answer for us: documentation,
    link-local, or unique-local space, never a public range."""
    for address in standins().ADDRESSES:
        ip = ipaddress.ip_address(address)
        assert ip.is_private or ip.is_link_local, address
        assert not ip.is_global, address


def imported_modules(tree: ast.AST) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
        elif isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
    return names


def test_no_test_module_imports_another():
    """Shared helpers live in e2e/framework/ and tests/support/, so a test module's helpers are not another's API
    (function-level imports count)."""
    offenders = {}
    for path in sorted([*(REPO / "e2e").rglob("*.py"), *(REPO / "tests").rglob("*.py")]):
        imported = {name for name in imported_modules(ast.parse(path.read_text())) if name.startswith("test_")}
        if imported:
            offenders[str(path.relative_to(REPO))] = sorted(imported)
    assert not offenders, offenders


def test_the_import_check_sees_a_test_module_import():
    assert imported_modules(ast.parse("from test_policy import apply_policy\nimport os")) == {"test_policy", "os"}
