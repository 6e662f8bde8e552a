"""A hostile program against the egress byte budget on the real cluster (issue 35, item 4): one CONNECT tunnel to an
allowed name, kept alive for 2 MB GETs, used to carry 10 MB under `egressBudget: {bytes: 100000}`, the bytes being
counted only when the tunnel closed. The proxy's tunnel relay (coderun/egress/relay.py) now cuts the tunnel where
the bytes flow. The egress tier (tests/egress/test_tunnel_relay.py) holds the controls: a budget above the
transfer lets it all through, and a revoked credential's open tunnel is closed while another run's is not."""
from __future__ import annotations

import pytest

from coderun.egress.relay import CHUNK_BYTES
from conftest import OPERATOR_MODE
from framework.egress import apply_policy, destinations, egress_policy, network_log, python, run  # noqa: F401 - a fixture
from framework.hostile import facts_of

pytestmark = [pytest.mark.skipif(OPERATOR_MODE != "chart", reason="the egress proxy is installed by the chart: "
                                 "CODERUN_E2E_OPERATOR=chart (make test)"),
              pytest.mark.cold_only, pytest.mark.timeout(600)]

BUDGET = 100_000
TUNNEL = r'''
import base64, http.client, os, ssl, urllib.parse
def kept_alive(host, count, size):
    """One CONNECT tunnel (the run's own credential, as HTTPS_PROXY gives it), `count` GETs of `size` bytes on it."""
    proxy = urllib.parse.urlsplit(os.environ["HTTPS_PROXY"])
    user, token = urllib.parse.unquote(proxy.username), urllib.parse.unquote(proxy.password)
    conn = http.client.HTTPSConnection(proxy.hostname, proxy.port, timeout=30,
                                       context=ssl.create_default_context(cafile="ca.pem"))
    conn.set_tunnel(host, 8443, headers={"Proxy-Authorization": "Basic " +
                                         base64.b64encode(f"{user}:{token}".encode()).decode()})
    whole = received = 0
    try:
        for _ in range(count):
            conn.request("GET", "/bytes/%d" % size)
            answer = conn.getresponse()
            while chunk := answer.read(65536):
                received += len(chunk)
            if answer.length:  # http.client ends a body cut short without an error: what it still expected
                return whole, received, "cut %d bytes short" % answer.length
            whole += 1
    except Exception as e:
        return whole, received, type(e).__name__
    return whole, received, None
'''


def test_one_kept_alive_tunnel_is_cut_at_the_run_s_byte_budget(operator, destinations, namespace):  # noqa: F811
    dest = destinations
    apply_policy(operator, namespace, egress_policy(dest, egressBudget={"bytes": BUDGET}))
    ended = run(operator, namespace, python(TUNNEL, f'''
        whole, received, error = kept_alive("{dest.name('web')}", 5, 2_000_000)
        report(whole=whole, received=received, error=error)'''), files=[{"path": "ca.pem", "content": dest.ca}])
    status = ended["status"]
    facts = facts_of(status)
    # It received (the positive control: the tunnel carried the run's budget) and was cut one chunk past it.
    assert facts["whole"] == 0 and facts["error"] is not None, facts
    assert BUDGET // 2 < facts["received"] <= BUDGET + CHUNK_BYTES, facts
    assert (status["phase"], status["reason"]) == ("Failed", "EgressBudgetExceeded"), status
    assert "(spec.egressBudget.bytes)" in status["message"], status["message"]
    network = status["network"]
    moved = network["bytesSent"] + network["bytesReceived"]
    assert BUDGET < moved <= BUDGET + 4 * CHUNK_BYTES, network
    [tunnel] = [r for r in network_log(operator, namespace, status) if r["method"] == "CONNECT"]
    assert (tunnel["host"], tunnel["verdict"]) == (dest.name("web"), "allowed"), tunnel
