"""The GPU's state around the timed blocks, through NVML (nvidia-ml-py): clocks, power, temperature,
throttle reasons, and energy from the board's total-energy counter. Read between blocks, never inside one."""
from __future__ import annotations

import torch

# Clock-event reasons that mean the GPU ran slower than it was asked to (NVML's nvmlClocksEventReason*)
THROTTLES = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake"}


def _nvml_handle(device: torch.device):
    """NVML's handle of the physical GPU behind this CUDA device (by UUID: CUDA and NVML number them apart)."""
    if device.type != "cuda":
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        from harness.clock import device_index
        from harness.measure.environment import gpu_facts

        uuid = gpu_facts(device_index(device)).get("gpu_uuid")
        return pynvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else None
    except Exception:  # noqa: BLE001 - no NVML (no driver library, no nvidia-ml-py): nothing to read
        return None


class GpuState:
    """Readings at the start and end of the timed blocks, and the energy each block drew."""

    def __init__(self, device: torch.device):
        self.handle = _nvml_handle(device)
        self.metrics: dict[str, float] = {}
        self.reasons = 0
        self.energy_mj = 0.0

    def read(self, when: str) -> None:
        if self.handle is None:
            return
        import pynvml

        h = self.handle
        self.metrics.update({
            f"gpu_sm_clock_mhz_{when}": float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_SM)),
            f"gpu_mem_clock_mhz_{when}": float(pynvml.nvmlDeviceGetClockInfo(h, pynvml.NVML_CLOCK_MEM)),
            f"gpu_power_w_{when}": pynvml.nvmlDeviceGetPowerUsage(h) / 1e3,
            f"gpu_temp_c_{when}": float(pynvml.nvmlDeviceGetTemperature(h, pynvml.NVML_TEMPERATURE_GPU)),
        })
        self.reasons |= pynvml.nvmlDeviceGetCurrentClocksEventReasons(h)

    def energy(self) -> float | None:
        """The board's energy counter in mJ, where it has one."""
        if self.handle is None:
            return None
        import pynvml

        try:
            return float(pynvml.nvmlDeviceGetTotalEnergyConsumption(self.handle))
        except pynvml.NVMLError:
            return None

    def add_block(self, start_mj: float | None) -> None:
        end = self.energy()
        if start_mj is not None and end is not None:
            self.energy_mj += end - start_mj

    def results(self, tokens: int, tags: dict[str, str]) -> dict[str, float]:
        """Metrics, and a `throttled` tag where a throttle reason was set during the blocks."""
        if self.handle is None:
            return {}
        if self.energy_mj:
            self.metrics["energy_j_per_token"] = self.energy_mj / 1e3 / tokens
        throttled = [name for bit, name in THROTTLES.items() if self.reasons & bit]
        if throttled:
            tags["throttled"] = ",".join(throttled)
        return self.metrics
