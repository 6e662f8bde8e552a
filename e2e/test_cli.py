"""`coderun` as a person or a shell script uses it: exit codes, --file, output, cleanup, kubectl's ways."""
import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import KUBECONFIG, REPO

CODERUN = str(Path(sys.executable).parent / "coderun")


def coderun(*args, namespace, cwd=None, input=None) -> subprocess.CompletedProcess:
    return subprocess.run([CODERUN, *args, "-n", namespace], capture_output=True, text=True, cwd=cwd, input=input,
                          env={**os.environ, "KUBECONFIG": str(KUBECONFIG)}, timeout=300)


@pytest.fixture
def cli(operator, namespace):
    return lambda *args, **kw: coderun(*args, namespace=namespace, **kw)


def test_the_exit_code_is_the_programs(cli, tmp_path):
    (tmp_path / "fail.py").write_text("import sys\nprint('partial')\nprint('bad input', file=sys.stderr)\nsys.exit(7)\n")
    done = cli("run", "fail.py", cwd=tmp_path)
    assert done.returncode == 7
    assert done.stdout == "partial\n"
    stderr = done.stderr.splitlines()
    assert stderr[0] == "bad input"
    assert stderr[-1].startswith("coderun: run-") and "exit code 7 (NonZeroExit)" in stderr[-1]


def test_an_artifact_named_with_escapes_cannot_drive_the_terminal_or_forge_the_summary(cli, tmp_path):
    """The third attack: an artifact named with OSC and CSI sequences and a carriage return set the terminal's
    title, erased the summary of a run that exited 3 and wrote a forged "exit code 0" over it."""
    (tmp_path / "forge.py").write_text(
        "import os\n"
        "name = 'plot.png\\x1b]0;pwned\\x07\\r\\x1b[2Kcoderun: run-x exit code 0 (Completed)'\n"
        "open(os.path.join(os.environ['CODERUN_OUTPUT_DIR'], name), 'w').write('x')\n"
        "raise SystemExit(3)\n")
    done = cli("run", "forge.py", cwd=tmp_path)
    assert done.returncode == 3, done.stderr
    for control in ("\x1b", "\x07", "\r"):
        assert control not in done.stdout + done.stderr, (control, done.stderr)
    summary = done.stderr.splitlines()[-1]
    assert summary.startswith("coderun: run-") and "exit code 3 (NonZeroExit)" in summary, summary
    assert "1 artifact(s): plot.png\\x1b]0;pwned\\x07\\x0d\\x1b[2Kcoderun: run-x exit code 0" in summary, summary


def test_run_on_a_csv_file_and_the_run_is_deleted_afterwards(cli, tmp_path):
    values = [round(random.uniform(0, 100), 2) for _ in range(20)]
    (tmp_path / "data.csv").write_text("city,value\n" + "".join(f"c{i},{v}\n" for i, v in enumerate(values)))
    (tmp_path / "sum.py").write_text("import csv\n"
                                     "print(round(sum(float(r['value']) for r in csv.DictReader(open('data.csv'))), 2))\n")
    done = cli("run", "sum.py", "--file", str(tmp_path / "data.csv"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert float(done.stdout) == pytest.approx(sum(values))
    listed = cli("list")
    assert (listed.returncode, listed.stdout) == (0, "") and listed.stderr.startswith("No resources found in")


def test_keep_then_get_logs_list_and_delete(cli):
    done = cli("run", "-", "--keep", "-o", "json", "-l", "team=a", input="import sys\nprint('out')\nsys.exit(3)\n")
    assert done.returncode == 3  # the program's exit code, not a coderun code
    result = json.loads(done.stdout)
    assert (result["exitCode"], result["reason"], result["stdout"]) == (3, "NonZeroExit", "out\n")
    name = result["name"]
    got = cli("get", name, "-o", "yaml")
    assert got.returncode == 0 and "exitCode: 3" in got.stdout
    logs = cli("logs", name)
    assert (logs.returncode, logs.stdout) == (3, "out\n")  # logs exits as the run did
    assert name in cli("list", "-l", "team=a", "--mine").stdout
    assert name not in cli("list", "-l", "team=b").stdout
    assert cli("-o", "name", "list", "-l", "team=a").stdout == f"coderun.coderun.io/{name}\n"  # -o before the command
    deleted = cli("delete", f"coderun.coderun.io/{name}")
    assert (deleted.returncode, deleted.stdout) == (0, f'coderun.coderun.io "{name}" deleted\n')
    assert cli("delete", name).returncode == 1  # NotFound, as kubectl
    assert cli("delete", name, "--ignore-not-found").returncode == 0


def test_logs_follow_waits_for_a_run_still_going(cli):
    gave_up = cli("run", "-c", "import time\ntime.sleep(4)\nprint('done')", "--keep", "--wait-timeout", "1s",
                  "-l", "t=follow")
    assert gave_up.returncode == 5 and "gave up waiting" in gave_up.stderr
    name = cli("list", "-l", "t=follow", "-o", "name").stdout.strip()
    followed = cli("logs", "-f", name, "--wait-timeout", "2m")
    assert (followed.returncode, followed.stdout) == (0, "done\n"), followed.stderr


@pytest.mark.parametrize("args,exit_code,summary", [
    (["-c", "print(1)", "--memory", "4Gi"], 3, "rejected (PolicyDenied, policy rule maximums.memory)"),
    (["-c", "print(1)", "--language", "ruby"], 3, "policy rule runtimes"),
    (["-c", "import time\ntime.sleep(30)", "--timeout", "1"], 124, "timed out after 1s"),
    (["-c", "import time\ntime.sleep(30)", "--timeout", "20s", "--wait-timeout", "1"], 5, "gave up waiting"),
])
def test_platform_outcomes_have_their_own_exit_codes(cli, args, exit_code, summary):
    done = cli("run", *args)
    assert done.returncode == exit_code, done.stderr
    assert summary in done.stderr.splitlines()[-1]


def test_policy_refusal_at_creation_is_a_rejected_status_with_o_json(cli):
    done = cli("run", "-c", "print(1)", "--memory", "4Gi", "-o", "json")
    assert done.returncode == 3, done.stderr
    result = json.loads(done.stdout)
    assert (result["phase"], result["reason"], result["policyRule"]) == ("Rejected", "PolicyDenied", "maximums.memory")
    assert result["message"]


def test_kubectl_plugin_entry_point_is_the_same_cli():
    done = subprocess.run([str(Path(CODERUN).with_name("kubectl-coderun")), "--help"], capture_output=True,
                          text=True, cwd=REPO)
    assert done.returncode == 0 and done.stdout.startswith("usage: kubectl coderun")
    assert "124    the program's own time limit" in done.stdout
