"""Every shell and Python example in README.md, docs/ and deploy/ runs as its page says, or
says why it cannot.

A fenced block is an example when it is tagged ``sh``, ``bash``, ``console`` or ``python``, or
when its first line is a command (``$ ``, ``pip``, ``python``, ``curl``, ``make``). Each
example carries a marker, an HTML comment on the line before its fence (not shown where the
page is rendered):

- ``<!-- example: skip: REASON -->``: not run, for REASON (it needs a GPU, it is what runs
  these tests, it is a fragment of the program above it...).
- ``<!-- example: file PATH -->``: not run; written to PATH under the page's work directory
  (``repository/<model>/...`` builds the model repository the page's server serves).
- ``<!-- example: serves -->``: a program that serves until stopped. It is started in the
  background; once its HTTP endpoint is ready, the page's ``run`` examples after it go to it,
  and at the page's end it gets SIGTERM and must exit 0.
- ``<!-- example: run -->``: run against the page's server (the ``serves`` program before it,
  else ``tritonfast serve`` started for the page, on the repository its ``file`` examples
  built or on the bundled examples). Python runs as a program; shell runs with bash. A block
  of ``$ command`` lines runs each command and must print exactly the lines the page shows
  after it; a trailing ``# TEXT`` comment on a shell command or a Python ``print`` line must
  be found in what the block printed, in order.

The ports the pages use (8000, 8001, 8002) become free ports.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.conftest import ROOT, free_ports
from tests.waiting import wait_for

PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "deploy" / "README.md"]
_FENCE = re.compile(r"^```(\w*)\s*$")
_MARKER = re.compile(r"^<!-- example: (skip: .+|file \S+|serves|run) -->$")
_COMMANDS = ("$ ", "pip ", "python ", "python3 ", "curl ", "make ")
_EXPECTED = re.compile(r"#\s*(.+?)\s*$")


@dataclass
class Example:
    page: Path
    line: int  # the fence's, from 1
    language: str
    text: str
    marker: str | None

    @property
    def where(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"

    @property
    def runnable(self) -> bool:
        if self.language in ("sh", "bash", "console", "python"):
            return True
        return not self.language and self.text.startswith(_COMMANDS)


def examples(page: Path) -> list[Example]:
    lines = page.read_text().splitlines()
    found, index = [], 0
    while index < len(lines):
        fence = _FENCE.match(lines[index])
        if fence is None:
            index += 1
            continue
        end = next(i for i in range(index + 1, len(lines)) if lines[i].startswith("```"))
        before = lines[index - 1].strip() if index else ""
        marker = _MARKER.match(before)
        found.append(
            Example(
                page,
                index + 1,
                fence.group(1),
                "\n".join(lines[index + 1 : end]) + "\n",
                marker.group(1) if marker else None,
            )
        )
        index = end + 1
    return found


def test_every_example_is_marked() -> None:
    unmarked = [e.where for page in PAGES for e in examples(page) if e.runnable and not e.marker]
    assert not unmarked, f"examples without a marker (see this test's docstring): {unmarked}"


@dataclass
class Ports:
    http: int
    grpc: int
    metrics: int

    def into(self, text: str) -> str:
        ports = {"8000": self.http, "8001": self.grpc, "8002": self.metrics}
        return re.sub(r"\b(800[012])\b", lambda m: str(ports[m.group(1)]), text)


@dataclass
class PageRun:
    """One page's work directory, its server and what its examples printed."""

    work: Path
    ports: Ports
    servers: list[subprocess.Popen[bytes]] = field(default_factory=list)

    def env(self) -> dict[str, str]:
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        return {**os.environ, "PATH": path}

    def start(self, command: list[str], log: str) -> None:
        with (self.work / log).open("wb") as out:
            server = subprocess.Popen(
                command, cwd=self.work, env=self.env(), stdout=out, stderr=subprocess.STDOUT
            )
        self.servers.append(server)
        wait_for(lambda: server.poll() is not None or self.ready(), f"{log}'s server")
        assert server.poll() is None, (self.work / log).read_text()

    def ready(self) -> bool:
        url = f"http://127.0.0.1:{self.ports.http}/v2/health/ready"
        try:
            with urllib.request.urlopen(url, timeout=2) as answer:
                return bool(answer.status == 200)
        except OSError:
            return False

    def ensure_server(self) -> None:
        if self.servers:
            return
        repository = self.work / "repository"
        command = [sys.executable, "-m", "tritonfast", "serve"]
        if repository.is_dir():
            command.append(f"--model-repository={repository}")
        command += [
            f"--http-port={self.ports.http}",
            f"--grpc-port={self.ports.grpc}",
            f"--metrics-port={self.ports.metrics}",
        ]
        self.start(command, "server.log")

    def stop(self) -> None:
        servers, self.servers = self.servers, []
        for server in servers:
            server.send_signal(signal.SIGTERM)
        for server in servers:
            assert server.wait(timeout=60) == 0, "a server of the page did not exit cleanly"


def _run_block(run: PageRun, example: Example) -> None:
    text = run.ports.into(example.text)
    if example.language == "python":
        program = run.work / f"example_{example.line}.py"
        program.write_text(text)
        printed = _output([sys.executable, str(program)], run)
        _expect_in_order(printed, _comments(text, lambda line: "print(" in line), example)
        return
    lines = text.splitlines()
    if lines and lines[0].startswith("$ "):
        _run_transcript(run, example, lines)
        return
    printed = _output(["bash", "-e", "-o", "pipefail", "-c", text], run)
    _expect_in_order(
        printed, _comments(text, lambda line: not line.lstrip().startswith("#")), example
    )


def _run_transcript(run: PageRun, example: Example, lines: list[str]) -> None:
    """``$ command`` lines, each followed by exactly what it prints."""
    index = 0
    while index < len(lines):
        command = lines[index][2:]
        shown = []
        index += 1
        while index < len(lines) and not lines[index].startswith("$ "):
            shown.append(lines[index].rstrip())
            index += 1
        printed = _output(["bash", "-e", "-o", "pipefail", "-c", command], run)
        got = [line.rstrip() for line in printed.splitlines()]
        while shown and not shown[-1]:
            shown.pop()
        while got and not got[-1]:
            got.pop()
        assert got == shown, f"{example.where}: `{command}` printed {got}, the page shows {shown}"


def _output(command: list[str], run: PageRun) -> str:
    done = subprocess.run(
        command, cwd=run.work, env=run.env(), capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, f"{command[-1][:200]} failed:\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _comments(text: str, eligible) -> list[str]:
    wanted = []
    for line in text.splitlines():
        code, hash_, _ = line.partition("#")
        if hash_ and code.strip() and eligible(line):
            found = _EXPECTED.search(line[len(code) :])
            if found:
                wanted.append(found.group(1))
    return wanted


def _expect_in_order(printed: str, wanted: list[str], example: Example) -> None:
    at = 0
    for text in wanted:
        found = printed.find(text, at)
        assert found >= 0, f"{example.where}: expected {text!r} in what it printed:\n{printed}"
        at = found + len(text)


@pytest.mark.parametrize(
    "page",
    [page for page in PAGES if any(e.marker in ("run", "serves") for e in examples(page))],
    ids=lambda page: str(page.relative_to(ROOT)),
)
def test_the_pages_examples_run_as_shown(page: Path, tmp_path: Path) -> None:
    run = PageRun(tmp_path, Ports(*free_ports(3)))
    try:
        for example in examples(page):
            marker = example.marker or ""
            if marker.startswith("file "):
                target = tmp_path / marker.removeprefix("file ")
                target.parent.mkdir(parents=True, exist_ok=True)
                target.write_text(example.text)
            elif marker == "serves":
                run.stop()  # the page's earlier server gives its ports to this program
                program = tmp_path / f"example_{example.line}.py"
                program.write_text(run.ports.into(example.text))
                run.start([sys.executable, str(program)], f"example_{example.line}.log")
            elif marker == "run":
                run.ensure_server()
                _run_block(run, example)
    finally:
        run.stop()
