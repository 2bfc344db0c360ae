"""--http-restricted-api / --grpc-restricted-protocol refusals, worded as Triton words them."""

from __future__ import annotations

import pytest
from tritonfast.errors import InvalidArgumentError
from tritonfast.frontends import restricted


@pytest.mark.parametrize(
    ("option", "kind"),
    [("--http-restricted-api", "api"), ("--grpc-restricted-protocol", "protocol")],
)
def test_repeated_and_unknown_groups(option: str, kind: str) -> None:
    with pytest.raises(InvalidArgumentError) as caught:
        restricted.parse(["model-repository,health:k1=v1", "metadata,health:k2=v2"], option)
    assert f"restricted {kind} 'health' can not be specified in multiple config groups" in (
        caught.value.message
    )
    with pytest.raises(InvalidArgumentError) as caught:
        restricted.parse(["model-reposit,health:k1=v1"], option)
    assert f"unknown restricted {kind} 'model-reposit'" in caught.value.message


def test_groups_and_headers() -> None:
    parsed = restricted.parse(["inference,health:key=value"], "--http-restricted-api")
    assert parsed == {
        "inference": restricted.Restriction("key", "value"),
        "health": restricted.Restriction("key", "value"),
    }
