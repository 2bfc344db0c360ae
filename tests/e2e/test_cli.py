"""The command line as a user meets it: ``python -m tritonfast`` run as a program, its help,
version, errors and what it says before serving."""

from __future__ import annotations

import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

from tritonfast import __version__

from tests.conftest import ROOT, free_ports
from tests.waiting import wait_for


def tritonfast(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tritonfast", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _command(*flags: str, ports: list[int]) -> list[str]:
    """``python -m tritonfast [serve] FLAGS...`` on ``ports`` (HTTP, gRPC, metrics), which
    ``flags`` may override (the last of a flag given twice wins)."""
    http, grpc, metrics = ports
    command = flags[:1] if flags[:1] == ("serve",) else ()
    return [
        sys.executable,
        "-m",
        "tritonfast",
        *command,
        f"--http-port={http}",
        f"--grpc-port={grpc}",
        f"--metrics-port={metrics}",
        *flags[len(command) :],
    ]


def _serve_until(text: str, tmp_path: Path, *flags: str) -> tuple[list[str], list[int]]:
    """Start the server with ``flags`` on free ports, stop it (SIGTERM, exit 0) once it has
    printed ``text``; the lines it printed, and its ports."""
    ports = free_ports(3)
    log = tmp_path / "server.log"
    with log.open("w") as out:
        server = subprocess.Popen(
            _command(*flags, ports=ports), stdout=out, stderr=subprocess.STDOUT
        )
    try:
        wait_for(lambda: text in log.read_text() or server.poll() is not None, repr(text), 60)
        assert server.poll() is None, log.read_text()
    finally:
        server.send_signal(signal.SIGTERM)
        code = server.wait(timeout=60)
    assert code == 0, log.read_text()
    return log.read_text().splitlines(), ports


def test_help_lists_every_command() -> None:
    shown = tritonfast("--help")
    assert shown.returncode == 0
    assert "serve" in shown.stdout and "selfcheck" in shown.stdout
    assert "--version" in shown.stdout


def test_version() -> None:
    for args in (["--version"], ["serve", "--version"]):
        shown = tritonfast(*args)
        assert (shown.returncode, shown.stdout.strip()) == (0, f"tritonfast {__version__}")


def test_serve_help_gives_every_flag_a_text_and_its_default() -> None:
    shown = tritonfast("serve", "--help")
    assert shown.returncode == 0
    text = " ".join(shown.stdout.split())  # argparse wraps lines
    for expected in (
        "--http-port PORT the HTTP endpoint's port (default: 8000)",
        "--grpc-address ADDRESS the address the gRPC endpoint listens on (default: 0.0.0.0)",
        "--log-verbose LEVEL verbose log messages: 0 none, 1 and up more of them (default: 0)",
        "(default: 30)",  # --exit-timeout-secs
        "(default: 15.0)",  # --repository-poll-secs
    ):
        assert expected in text, expected


def test_an_unknown_flag_is_reported_with_serves_usage() -> None:
    for args in (["serve", "--htp-port=1"], ["--htp-port=1"]):
        refused = tritonfast(*args)
        assert refused.returncode == 2
        assert refused.stderr.startswith("usage: tritonfast serve"), refused.stderr
        assert "unrecognized arguments: --htp-port=1" in refused.stderr


def test_selfcheck_names_what_it_checks() -> None:
    refused = tritonfast("selfcheck", "onnx")
    assert refused.returncode == 2
    assert refused.stderr.startswith("usage: tritonfast selfcheck"), refused.stderr
    assert "invalid choice: 'onnx'" in refused.stderr and "tensorrt" in refused.stderr


def test_without_a_repository_it_says_what_it_serves_and_where(tmp_path) -> None:
    printed, (http, grpc, metrics) = _serve_until(
        f"tritonfast {__version__} ready", tmp_path, "--http-address=127.0.0.1"
    )
    first = printed[0]
    assert first.startswith("No --model-repository given: serving the bundled example"), first
    assert (
        f"(HTTP on 127.0.0.1:{http}, gRPC on 0.0.0.0:{grpc}, metrics on 0.0.0.0:{metrics};"
        " `tritonfast serve --help` lists the options)"
    ) in first
    # Then the options in effect, before any model loads; then the models; then the services.
    rows = {
        cells[0]: cells[1]
        for line in printed
        if line.startswith("| ")
        and len(cells := [cell.strip() for cell in line.strip("|").split("|")]) == 2
    }
    assert rows["model_control_mode"] == "MODE_NONE"
    assert rows["python_instance_mode"] == "process"
    assert rows["http_endpoint"] == f"127.0.0.1:{http}"
    order = [
        next(i for i, line in enumerate(printed) if line.startswith(prefix))
        for prefix in ("| Option", "| Model", "Started HTTPService")
    ]
    assert order == sorted(order), printed


def test_failed_models_keep_the_table_readable_and_the_banner_honest(tmp_path) -> None:
    """With --exit-on-error=false and models that fail (a Python traceback among them): every
    row of the status table is one line, a failed version shows its number, and the banner
    says the server is not ready (its /v2/health/ready answers 400)."""
    lines, _ = _serve_until(
        "serving, but not ready",
        tmp_path,
        "serve",
        f"--model-repository={ROOT / 'tests' / 'models_broken'}",
        "--exit-on-error=false",
    )
    table = _model_table(lines)
    assert len({len(line) for line in table}) == 1, "\n".join(table)
    assert any(
        [cell.strip() for cell in line.split("|")[1:3]] == ["init_fail", "1"]
        and "UNAVAILABLE: Internal: RuntimeError: init_fail cannot start" in line
        for line in table
    ), "\n".join(table)
    assert not any(line.endswith(f"tritonfast {__version__} ready") for line in lines)


def _model_table(lines: list[str]) -> list[str]:
    """The lines of the model status table (its borders too) in the server's output."""
    header = next(i for i, line in enumerate(lines) if line.startswith("| Model "))
    end = next(i for i in range(header + 2, len(lines)) if lines[i].startswith("+-"))
    return lines[header - 1 : end + 1]


def _refused_start(*flags: str, check_loaded: bool = True) -> str:
    """Start the server (on the bundled examples, unless ``flags`` name a repository): it must
    exit 1, before any model loads unless not ``check_loaded``; what it printed."""
    started = subprocess.run(
        _command("serve", *flags, ports=free_ports(3)),
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    printed = started.stdout + started.stderr
    assert started.returncode == 1, printed
    if check_loaded:
        assert "successfully loaded" not in printed, printed
    return printed


def test_a_busy_port_fails_the_start_at_once_naming_its_flag() -> None:
    with socket.socket() as busy:
        busy.bind(("0.0.0.0", 0))
        busy.listen()
        port = busy.getsockname()[1]
        printed = _refused_start(f"--grpc-port={port}")
    assert (
        f"the gRPC endpoint cannot listen on 0.0.0.0:{port} (--grpc-port): address already in use"
    ) in printed
    assert "Started" not in printed


def test_tls_flags_are_checked_before_models_load(tmp_path) -> None:
    printed = _refused_start("--grpc-use-ssl=true")
    assert "--grpc-use-ssl needs --grpc-server-cert and --grpc-server-key" in printed
    missing = tmp_path / "nowhere.pem"
    printed = _refused_start(f"--http-tls-cert={missing}")
    assert f"cannot read --http-tls-cert '{missing}': No such file or directory" in printed


MISSPELT_ENSEMBLE = """
name: "ens"
platform: "ensemble"
max_batch_size: 0
input [ { name: "IN" data_type: TYPE_INT32 dims: [ 1 ] } ]
output [ { name: "OUT" data_type: TYPE_INT32 dims: [ 1 ] } ]
ensemble_scheduling { step [ {
  model_name: "add_onee" model_version: -1
  input_map { key: "X" value: "IN" } output_map { key: "Y" value: "OUT" }
} ] }
"""


def test_a_misspelt_ensemble_step_is_one_failed_model(tmp_path) -> None:
    """The ensemble fails, naming the step it cannot find; the name it misspelt is no row of
    its own, and one model counts as failed."""
    repository = tmp_path / "repository"
    shutil.copytree(ROOT / "tests" / "models_ensemble" / "add_one", repository / "add_one")
    (repository / "ens" / "1").mkdir(parents=True)
    (repository / "ens" / "config.pbtxt").write_text(MISSPELT_ENSEMBLE)
    printed = _refused_start(f"--model-repository={repository}", check_loaded=False)
    table = [line for line in _model_table(printed.splitlines()) if line.startswith("| ")]
    names = [line.split("|")[1].strip() for line in table]
    assert names == ["Model", "add_one", "ens"], "\n".join(table)
    assert "depends on 'add_onee'" in table[2]
    assert "exiting: 1 model(s) failed to load" in printed
