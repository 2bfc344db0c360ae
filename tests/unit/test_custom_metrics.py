"""pb_utils.MetricFamily / Metric semantics (Triton's Python backend) and their exposition."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
from prometheus_client import CollectorRegistry
from tritonfast.backends.python import pb_utils
from tritonfast.custommetrics import DELETED_FAMILY, ServerCustomMetrics
from tritonfast.metrics import ModelMetrics, exposition
from tritonfast.runtime import handle

Family = pb_utils.MetricFamily


class _MetricsOfAServer:
    """What ``pb_utils.MetricFamily`` reaches of the server a model runs for."""

    def __init__(self) -> None:
        self.custom_metrics = ServerCustomMetrics()


@pytest.fixture(autouse=True)
def server() -> Iterator[_MetricsOfAServer]:
    """The families each test makes register in a server's metrics of their own."""
    server = _MetricsOfAServer()
    with handle.serving(server):  # type: ignore[arg-type]  # only its metrics are reached
        yield server


def unique(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex[:8]}"


def rendered() -> str:
    metrics = handle.current().custom_metrics
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ModelMetrics(metrics))
    return exposition(registry).decode()


def test_counter_only_goes_up() -> None:
    family = Family(unique("c"), "a counter", Family.COUNTER)
    metric = family.Metric(labels={"a": "1"})
    assert metric.value() == 0.0
    metric.increment(2023)
    assert metric.value() == 2023
    for misuse in (lambda: metric.increment(-1), lambda: metric.set(5), lambda: metric.observe(1)):
        with pytest.raises(pb_utils.TritonModelException):
            misuse()


def test_gauge_goes_both_ways_and_sets() -> None:
    family = Family(unique("g"), "a gauge", Family.GAUGE)
    metric = family.Metric()
    metric.increment(10)
    metric.increment(-2.5)
    assert metric.value() == 7.5
    metric.set(999.9)
    assert metric.value() == 999.9
    with pytest.raises(pb_utils.TritonModelException):
        metric.observe(1)


def test_histogram_buckets_and_exposition() -> None:
    name = unique("h")
    family = Family(name, "a histogram", Family.HISTOGRAM)
    for bad in (None, [2.5, 0.1], [1, 1, 2]):
        with pytest.raises(pb_utils.TritonModelException):
            family.Metric(labels={}, buckets=bad)
    family.Metric(labels={"x": "empty"}, buckets=[])
    metric = family.Metric(labels={"e1": "l1", "e2": "l2"}, buckets=[0.1, 1.0, 2.5, 5.0, 10.0])
    for misuse in (metric.value, lambda: metric.increment(1), lambda: metric.set(1)):
        with pytest.raises(pb_utils.TritonModelException):
            misuse()
    for datum in (0.05, 1.5, 6.0):
        metric.observe(datum)
    text = rendered()
    labels = 'e1="l1",e2="l2"'
    for le, count in (("0.1", 1), ("1", 1), ("2.5", 2), ("5", 2), ("10", 3), ("+Inf", 3)):
        assert f'{name}_bucket{{{labels},le="{le}"}} {count}\n' in text
    assert f"{name}_count{{{labels}}} 3\n" in text
    assert f"{name}_sum{{{labels}}} 7.55\n" in text
    assert f"# TYPE {name} histogram\n" in text


def test_same_labels_share_one_metric() -> None:
    family = Family(unique("dup"), "dup metric", Family.COUNTER)
    first, second = family.Metric(labels={"k": "v"}), family.Metric(labels={"k": "v"})
    first.increment(7.5)
    assert second.value() == 7.5


def test_families_of_one_name_share_registration() -> None:
    name = unique("fam")
    first = Family(name, "first description", Family.COUNTER)
    second = Family(name, "second description", Family.COUNTER)
    with pytest.raises(pb_utils.TritonModelException):
        Family(name, "another kind", Family.GAUGE)
    second.Metric(labels={"k": "2"})
    first.Metric(labels={"k": "1"})
    text = rendered()
    assert f"# HELP {name} first description\n" in text
    assert f'{name}{{k="1"}} 0\n' in text and f'{name}{{k="2"}} 0\n' in text
    del first
    assert f"# HELP {name} first description\n" in rendered()  # `second` still holds it


def test_metrics_of_a_deleted_family_refuse_every_operation() -> None:
    name = unique("gone")
    family = Family(name, "short-lived", Family.GAUGE)
    metric = family.Metric(labels={"a": "b"})
    del family
    for operation in (lambda: metric.set(1), lambda: metric.increment(1), metric.value):
        with pytest.raises(pb_utils.TritonModelException, match=DELETED_FAMILY):
            operation()
    assert name not in rendered()


@pytest.mark.parametrize("name", ["my-metric", "", "1abc", "nv_inference_count"])
def test_family_names_are_checked(name: str) -> None:
    with pytest.raises(pb_utils.TritonModelException, match="name"):
        Family(name, "bad", Family.COUNTER)


def test_a_gauge_of_several_workers_shows_the_newest_value() -> None:
    from tritonfast.custommetrics import GAUGE, Series, merge

    labels = (("model", "m"),)
    newer = ("g", "doc", GAUGE, [Series(labels, 5.0, changed_ns=200)])
    older = ("g", "doc", GAUGE, [Series(labels, 2.0, changed_ns=100)])
    for states in ([[newer], [older]], [[older], [newer]]):
        ((_, _, _, (series,)),) = merge(states)
        assert series.value == 5.0


def test_a_family_made_where_no_server_runs_is_refused() -> None:
    with handle.serving(None), pytest.raises(pb_utils.TritonModelException, match="not serving"):
        Family(unique("lonely"), "no server", Family.COUNTER)
