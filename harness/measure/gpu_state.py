"""Which physical GPU a CUDA device is (its name, driver and UUID), and its state around the timed blocks, through
NVML (nvidia-ml-py): clocks, power, temperature, throttle reasons, and energy from the board's total-energy counter.
Read between blocks, never inside one. The bottom of a chain: the environment's tags and the fingerprint read the
GPU through this module, which imports neither."""
from __future__ import annotations

import functools
import os
import re
import subprocess
from pathlib import Path

import torch

from harness.clock import device_index

# Clock-event reasons that mean the GPU ran slower than it was asked to (NVML's nvmlClocksEventReason*)
THROTTLES = {0x4: "sw_power_cap", 0x8: "hw_slowdown", 0x20: "sw_thermal", 0x40: "hw_thermal", 0x80: "hw_power_brake"}
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")


@functools.lru_cache(maxsize=8)
def gpu_facts(index: int) -> dict[str, str]:
    """Name, driver and UUID of the GPU this process sees as `index`. The UUID names the physical GPU
    even when SLURM (or CUDA_VISIBLE_DEVICES) renumbers what the process sees."""
    props = torch.cuda.get_device_properties(index)
    facts = {"gpu_name": props.name}
    uuid = str(getattr(props, "uuid", "") or "").removeprefix("GPU-")
    if _UUID.match(uuid):
        facts["gpu_uuid"] = f"GPU-{uuid}"
    elif (visible := _visible_gpu(index)) is not None:  # nvidia-smi numbers physical GPUs
        found = _nvidia_smi(f"--id={visible}", "--query-gpu=uuid", "--format=csv,noheader")
        if found:
            facts["gpu_uuid"] = found.strip()
    driver = _nvidia_smi("--query-gpu=driver_version", "--format=csv,noheader")
    if driver:
        facts["gpu_driver"] = driver.splitlines()[0].strip()
    return facts


def command_output(*cmd: str, cwd: Path | None = None) -> str | None:
    """A command's output, stripped, or None where it is missing, fails or runs past 10 s (nvidia-smi here, git for
    the environment's tags)."""
    try:
        out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=10, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip()


def _nvidia_smi(*args: str) -> str | None:
    """nvidia-smi's answer, or None where it is missing or fails."""
    return command_output("nvidia-smi", *args)


def _visible_gpu(index: int) -> str | None:
    """The physical GPU (index or UUID, as nvidia-smi takes it) behind this process's `cuda:index`."""
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if not visible:
        return str(index)
    return visible[index] if index < len(visible) else None


def nvml_handle(device: torch.device):
    """NVML's handle of the physical GPU behind this CUDA device (by UUID: CUDA and NVML number them apart)."""
    if device.type != "cuda":
        return None
    try:
        import pynvml

        pynvml.nvmlInit()
        uuid = gpu_facts(device_index(device)).get("gpu_uuid")
        return pynvml.nvmlDeviceGetHandleByUUID(uuid) if uuid else None
    except Exception:  # noqa: BLE001 - no NVML (no driver library, no nvidia-ml-py): nothing to read
        return None


class GpuState:
    """Readings at the start and end of the timed blocks, and the energy each block drew."""

    def __init__(self, device: torch.device):
        self.handle = nvml_handle(device)
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
