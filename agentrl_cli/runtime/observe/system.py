"""Host figures sampled with each metrics row: accelerator utilisation and memory through NVML when a
GPU exists (`system/gpu<i>/util_percent`, `system/gpu<i>/mem_used_mb`), CPU and resident memory of
this process and its children otherwise and always (`system/cpu_percent`, `system/rss_mb`,
`system/children_rss_mb`). Belongs here: sampling; nothing here decides anything."""

from __future__ import annotations

import logging

import psutil

log = logging.getLogger(__name__)
MB = 1024 * 1024


class SystemSampler:
    def __init__(self) -> None:
        self.proc = psutil.Process()
        self.proc.cpu_percent(None)  # the first call starts the interval the next one measures
        self.nvml = None
        self.gpus: list = []
        try:
            import pynvml  # optional: only GPU hosts have it (package nvidia-ml-py)

            pynvml.nvmlInit()
            self.nvml = pynvml
            self.gpus = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
        except Exception as exc:  # noqa: BLE001 - no NVML library or no driver: a CPU host
            log.debug("NVML not available (%s); sampling CPU and RSS only", exc)

    def sample(self) -> dict:
        out: dict = {}
        try:
            children = self.proc.children(recursive=True)
            out["system/cpu_percent"] = round(self.proc.cpu_percent(None), 1)
            out["system/rss_mb"] = round(self.proc.memory_info().rss / MB, 1)
            rss = 0
            for c in children:
                try:
                    rss += c.memory_info().rss
                except psutil.Error:
                    continue  # a child that ended between listing and reading
            out["system/children_rss_mb"] = round(rss / MB, 1)
        except psutil.Error as exc:
            log.debug("sampling this process failed: %s", exc)
        for i, handle in enumerate(self.gpus):
            try:
                util = self.nvml.nvmlDeviceGetUtilizationRates(handle)
                mem = self.nvml.nvmlDeviceGetMemoryInfo(handle)
                out[f"system/gpu{i}/util_percent"] = float(util.gpu)
                out[f"system/gpu{i}/mem_used_mb"] = round(mem.used / MB, 1)
                out[f"system/gpu{i}/mem_total_mb"] = round(mem.total / MB, 1)
            except Exception as exc:  # noqa: BLE001 - a GPU that stopped answering must not stop the run
                log.debug("NVML sample of GPU %d failed: %s", i, exc)
        return out

    def close(self) -> None:
        if self.nvml is not None:
            try:
                self.nvml.nvmlShutdown()
            except Exception:  # noqa: BLE001 - shutting down a library that is going away anyway
                pass
