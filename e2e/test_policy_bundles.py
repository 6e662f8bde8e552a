"""Every bundle under policies/ applies to the real API server (server-side dry run: schema and CEL rules)."""
from pathlib import Path

import pytest

BUNDLES = sorted(p.parent for p in (Path(__file__).parents[1] / "policies").glob("*/kustomization.yaml"))


@pytest.mark.parametrize("bundle", BUNDLES, ids=[b.name for b in BUNDLES])
def test_bundle_dry_runs_clean_on_the_api_server(operator, namespace, bundle):
    result = operator.kubectl("apply", "-k", str(bundle), "-n", namespace, "--dry-run=server", check=False)
    assert result.returncode == 0, result.stderr
    assert "coderunpolicy.coderun.io/" in result.stdout and "(server dry run)" in result.stdout, result.stdout
