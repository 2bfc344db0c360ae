"""The server's log: Triton's line format, severity switches, and the logging extension."""

from __future__ import annotations

import re
import time
import uuid
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from tests.conftest import EXAMPLES, TEST_MODELS, start_server

DEFAULTS = {
    "log_file": "",
    "log_info": True,
    "log_warning": True,
    "log_error": True,
    "log_verbose_level": 0,
    "log_format": "default",
}
# I1122 02:09:33.854363 709 model.py:14] "message"
DEFAULT_LINE = re.compile(r'^[IWE]\d{4} \d\d:\d\d:\d\d\.\d{6} \d+ [\w.]+:\d+\] ".*"$')
ISO_LINE = re.compile(r'^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ [IWE] \d+ [\w.]+:\d+\] ".*"$')


def log_through_model(client: Any, model: str = "logger") -> str:
    marker = f"marker-{uuid.uuid4().hex[:8]}"
    text = httpclient.InferInput("TEXT", [1], "BYTES")
    text.set_data_from_numpy(np.array([marker.encode()], dtype=np.object_))
    client.infer(model, [text])
    return marker


def lines_with(log: str, marker: str) -> list[str]:
    return [line for line in log.splitlines() if marker in line]


def wait_for_lines(read: Any, marker: str, count: int) -> list[str]:
    deadline = time.monotonic() + 5
    while len(found := lines_with(read(), marker)) < count and time.monotonic() < deadline:
        time.sleep(0.05)
    return found


def test_settings_over_http_and_grpc(server: Any) -> None:
    http = httpclient.InferenceServerClient(server.http_url)
    grpc = grpcclient.InferenceServerClient(server.grpc_url)
    try:
        assert http.get_log_settings() == DEFAULTS
        settings = grpc.get_log_settings(as_json=True)["settings"]
        assert settings["log_verbose_level"] == {"uint32_param": 0}
        assert settings["log_info"] == {"bool_param": True}
        assert http.update_log_settings({"log_verbose_level": 2}) == {
            **DEFAULTS,
            "log_verbose_level": 2,
        }
        reply = grpc.update_log_settings({"log_verbose_level": 0}, as_json=True)
        assert reply["settings"]["log_verbose_level"] == {"uint32_param": 0}
        assert http.get_log_settings() == DEFAULTS
    finally:
        http.close()
        grpc.close()


@pytest.mark.parametrize(
    ("change", "status", "message"),
    [
        ({"log_file": "/tmp/x.log"}, "501", "can not be updated through network protocol"),
        ({"log_format": "xml"}, "503", "invalid argument for --log_format, got: xml"),
        ({"log_info": "yes"}, "500", "non-boolean"),
        ({"log_verbose_level": -1}, "500", "non-unsigned-integer"),
    ],
)
def test_bad_settings(server: Any, change: dict[str, Any], status: str, message: str) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        with pytest.raises(InferenceServerException, match=message) as info:
            client.update_log_settings(change)
        assert info.value.status() == status
        assert client.get_log_settings() == DEFAULTS
    finally:
        client.close()


@pytest.mark.parametrize("model", ["logger", "logger_proc"], ids=["in-process", "worker"])
def test_model_logs_obey_the_switches(server: Any, model: str) -> None:
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        marker = log_through_model(client, model)
        found = wait_for_lines(server.log, marker, 3)
        assert [line[0] for line in found] == ["I", "W", "E"]
        assert all(DEFAULT_LINE.match(line) for line in found), found
        assert all(" model.py:" in line for line in found), found  # where the model logged
        assert f'"{marker} info"' in found[0]

        client.update_log_settings({"log_verbose_level": 1, "log_info": False})
        marker = log_through_model(client, model)
        found = wait_for_lines(server.log, marker, 3)
        assert [line.split('"')[1] for line in found] == [
            f"{marker} warning",
            f"{marker} error",
            f"{marker} verbose",
        ]
    finally:
        client.update_log_settings({"log_verbose_level": 0, "log_info": True})
        client.close()


def test_log_file_and_iso8601_format(tmp_path: Path) -> None:
    log_file = tmp_path / "triton.log"
    server = start_server(
        [EXAMPLES, TEST_MODELS],
        tmp_path / "stdout.log",
        f"--log-file={log_file}",
        "--log-format=ISO8601",
        "--log-warning=false",
    )
    client = httpclient.InferenceServerClient(server.http_url)
    try:
        assert client.get_log_settings()["log_file"] == str(log_file)
        assert client.get_log_settings()["log_format"] == "ISO8601"
        marker = log_through_model(client)
        found = wait_for_lines(log_file.read_text, marker, 2)
        assert [line.split(" ")[1] for line in found] == ["I", "E"]  # warnings are off
        assert all(ISO_LINE.match(line) for line in found), found
        assert marker not in server.log()  # the log went to the file, not stderr
    finally:
        client.close()
        assert server.stop() == 0
