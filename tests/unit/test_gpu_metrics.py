"""Triton's GPU gauges as the metrics endpoint exports them, per device. No GPU runs here, so
NVML is a stand-in with two devices, one of which cannot read its power limit (a reading a GPU
does not support is left out, not an error). With a GPU, tests/e2e/test_metrics.py checks the
real thing."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from prometheus_client import CollectorRegistry, generate_latest
from tritonfast.metrics import GpuMetrics


class _StandInNvml:
    """The NVML calls GpuMetrics makes, for two devices."""

    def __init__(self) -> None:
        self.energy_mj = [1000.0, 5000.0]

    def nvmlDeviceGetCount(self) -> int:
        return 2

    def nvmlDeviceGetHandleByIndex(self, index: int) -> int:
        return index

    def nvmlDeviceGetUUID(self, handle: int) -> bytes:
        return f"GPU-{handle}".encode()

    def nvmlDeviceGetUtilizationRates(self, handle: int) -> Any:
        return SimpleNamespace(gpu=50 + handle)

    def nvmlDeviceGetMemoryInfo(self, handle: int) -> Any:
        return SimpleNamespace(total=(handle + 1) << 30, used=handle << 20)

    def nvmlDeviceGetPowerUsage(self, handle: int) -> int:
        return 70_000 + handle  # mW

    def nvmlDeviceGetPowerManagementLimit(self, handle: int) -> int:
        if handle == 1:
            raise RuntimeError("NVML_ERROR_NOT_SUPPORTED")
        return 300_000

    def nvmlDeviceGetTotalEnergyConsumption(self, handle: int) -> float:
        return self.energy_mj[handle]


def _scrape(gpus: GpuMetrics) -> dict[str, float]:
    registry = CollectorRegistry()
    registry.register(gpus)
    samples = {}
    for line in generate_latest(registry).decode().splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


def test_each_device_gets_every_reading_it_supports() -> None:
    gpus = GpuMetrics()
    nvml = _StandInNvml()
    gpus._nvml = nvml
    first = _scrape(gpus)
    assert first == {
        'nv_gpu_utilization{gpu_uuid="GPU-0"}': 0.5,
        'nv_gpu_utilization{gpu_uuid="GPU-1"}': 0.51,
        'nv_gpu_memory_total_bytes{gpu_uuid="GPU-0"}': float(1 << 30),
        'nv_gpu_memory_total_bytes{gpu_uuid="GPU-1"}': float(2 << 30),
        'nv_gpu_memory_used_bytes{gpu_uuid="GPU-0"}': 0.0,
        'nv_gpu_memory_used_bytes{gpu_uuid="GPU-1"}': float(1 << 20),
        'nv_gpu_power_usage{gpu_uuid="GPU-0"}': 70.0,
        'nv_gpu_power_usage{gpu_uuid="GPU-1"}': 70.001,
        'nv_gpu_power_limit{gpu_uuid="GPU-0"}': 300.0,  # GPU-1 cannot read it: left out
        'nv_energy_consumption{gpu_uuid="GPU-0"}': 0.0,  # Triton's name: no _total
        'nv_energy_consumption{gpu_uuid="GPU-1"}': 0.0,
    }
    nvml.energy_mj = [3500.0, 5000.0]  # joules since the server started, not since boot
    assert _scrape(gpus)['nv_energy_consumption{gpu_uuid="GPU-0"}'] == 2.5


def test_without_nvml_nothing_is_exported() -> None:
    gpus = GpuMetrics()
    gpus._nvml = None
    assert _scrape(gpus) == {}
