"""gRPC over TLS and mutual TLS (Triton's --grpc-use-ssl flags), and HTTPS for the HTTP port
(tritonfast's --http-tls-cert), with certificates the tests make with openssl and
tritonclient's ssl options."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import TEST_MODELS, start_server
from tests.waiting import wait_for

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs openssl")


def openssl(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A CA, and a server and a client certificate it signed (the server's for 127.0.0.1),
    with the extensions strict verification wants (Python 3.13's default)."""
    folder = tmp_path_factory.mktemp("tls")
    openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", "/CN=test-ca",
            "-addext", "basicConstraints=critical,CA:TRUE",
            "-addext", "keyUsage=critical,keyCertSign,cRLSign",
            "-keyout", "ca.key", "-out", "ca.pem", cwd=folder)  # fmt: skip
    (folder / "san.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\n"
        "basicConstraints=CA:FALSE\n"
        "authorityKeyIdentifier=keyid,issuer\n"
        "keyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth,clientAuth\n"
    )
    for name in ("server", "client"):
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={name}",
                "-keyout", f"{name}.key", "-out", f"{name}.csr", cwd=folder)  # fmt: skip
        openssl("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-days", "1", "-extfile", "san.ext",
                "-out", f"{name}.pem", cwd=folder)  # fmt: skip
    return folder


def identity(client: grpcclient.InferenceServerClient) -> list[float]:
    tensor = grpcclient.InferInput("INPUT0", [1, 3], "FP32")
    tensor.set_data_from_numpy(np.array([[1, 2, 3]], np.float32))
    return client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0")[0].tolist()


@pytest.mark.parametrize("mutual", [False, True])
def test_grpc_over_tls(certificates: Path, tmp_path: Path, mutual: bool) -> None:
    flag = "--grpc-use-ssl-mutual=true" if mutual else "--grpc-use-ssl=true"
    server = start_server(
        [TEST_MODELS],
        tmp_path / "server.log",
        flag,
        f"--grpc-server-cert={certificates / 'server.pem'}",
        f"--grpc-server-key={certificates / 'server.key'}",
        f"--grpc-root-cert={certificates / 'ca.pem'}",
    )
    try:
        client_files = {"root_certificates": str(certificates / "ca.pem")}
        if mutual:
            client_files["private_key"] = str(certificates / "client.key")
            client_files["certificate_chain"] = str(certificates / "client.pem")
        client = grpcclient.InferenceServerClient(server.grpc_url, ssl=True, **client_files)
        assert identity(client) == [1.0, 2.0, 3.0]
        client.close()
        plain = grpcclient.InferenceServerClient(server.grpc_url)  # no TLS: refused
        with pytest.raises(InferenceServerException):
            plain.is_server_live(client_timeout=5)
        plain.close()
        if mutual:  # TLS without a client certificate: refused too
            anonymous = grpcclient.InferenceServerClient(
                server.grpc_url, ssl=True, root_certificates=str(certificates / "ca.pem")
            )
            with pytest.raises(InferenceServerException):
                anonymous.is_server_live(client_timeout=5)
            anonymous.close()
    finally:
        assert server.stop() == 0


def test_https_for_the_http_port(certificates: Path, tmp_path: Path) -> None:
    import tritonclient.http as httpclient

    server = start_server(
        [TEST_MODELS],
        tmp_path / "server.log",
        f"--http-tls-cert={certificates / 'server.pem'}",
        f"--http-tls-key={certificates / 'server.key'}",
        wait_ready=False,
    )
    try:
        client = httpclient.InferenceServerClient(
            server.http_url, ssl=True, ssl_options={"ca_certs": str(certificates / "ca.pem")}
        )
        wait_for(lambda: _live(client), "the HTTPS port to answer")
        tensor = httpclient.InferInput("INPUT0", [1, 3], "FP32")
        tensor.set_data_from_numpy(np.array([[1, 2, 3]], np.float32))
        answer = client.infer("identity_fp32", [tensor])
        assert answer.as_numpy("OUTPUT0").tolist() == [[1.0, 2.0, 3.0]]
        big = np.arange(1 << 20, dtype=np.float32).reshape(1, -1)  # a direct-body upload
        tensor = httpclient.InferInput("INPUT0", list(big.shape), "FP32")
        tensor.set_data_from_numpy(big)
        assert np.array_equal(client.infer("identity_fp32", [tensor]).as_numpy("OUTPUT0"), big)
        client.close()
    finally:
        assert server.stop() == 0


def _live(client: object) -> bool:
    try:
        return bool(client.is_server_live())  # type: ignore[attr-defined]
    except Exception:
        return False
