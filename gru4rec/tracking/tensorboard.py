"""Live tracking in TensorBoard: per-epoch scalars through ``torch.utils.tensorboard``.

:class:`TensorBoardLogger` is a ``fit`` callback. After every epoch it writes, at step = epoch:

========================  ===================================================================
``train/loss``            the epoch's loss
``speed/mb_per_s``        mini-batches per second; ``speed/events_per_s`` events per second
``time/epoch_seconds``    the epoch's training time
``memory/peak_host_mb``   the process's peak resident memory; on CUDA also
                          ``memory/peak_device_mb`` (peak allocated by torch)
``valid/<metric>@<k>``    the validation metrics, when ``fit`` validates
``gpu/utilization_pct``   on CUDA, with nvidia-ml-py: the GPU's mean utilisation over the epoch
                          (sampled every :data:`GPU_SAMPLE_SECONDS`), and ``gpu/memory_used_mb``
                          the most memory in use on the GPU during the epoch — the numbers
                          ``nvidia-smi`` shows
========================  ===================================================================

Needs the ``tensorboard`` package (``pip install 'gru4rec[tensorboard]'``, which also brings
nvidia-ml-py); view with ``tensorboard --logdir DIR``.
"""
from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:  # typing only
    from gru4rec.fitting import EpochInfo

__all__ = ["GPU_SAMPLE_SECONDS", "GpuMonitor", "TensorBoardLogger", "import_summary_writer"]

log = logging.getLogger(__name__)

#: Seconds between two samples of the GPU's utilisation and memory.
GPU_SAMPLE_SECONDS = 0.2


def import_summary_writer() -> Any:
    """``torch.utils.tensorboard.SummaryWriter``, or ImportError with the install hint."""
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError as exc:
        raise ImportError("--tensorboard needs tensorboard: pip install 'gru4rec[tensorboard]'") from exc
    return SummaryWriter


class GpuMonitor:
    """Samples one CUDA device's utilisation and memory in use with NVML (nvidia-ml-py) in a
    background thread; :meth:`read` gives the mean utilisation and the peak memory since the
    last read. Raises ImportError (with the hint) without nvidia-ml-py."""

    def __init__(self, device: torch.device, interval: float = GPU_SAMPLE_SECONDS) -> None:
        try:
            import pynvml
        except ImportError as exc:
            raise ImportError("GPU utilisation in TensorBoard needs nvidia-ml-py: pip install 'gru4rec[tensorboard]'") from exc
        self._nvml = pynvml
        pynvml.nvmlInit()
        index = device.index if device.index is not None else torch.cuda.current_device()
        props = torch.cuda.get_device_properties(index)
        # torch's index counts the devices CUDA_VISIBLE_DEVICES lets through; NVML counts all of
        # them, so find the device by its PCI address (by index where torch does not give it).
        try:
            # Read by name: older torch builds lack these fields (AttributeError, handled below).
            domain, bus, dev = (getattr(props, f"pci_{part}_id") for part in ("domain", "bus", "device"))
            bus_id = f"{domain:08x}:{bus:02x}:{dev:02x}.0"
            self._handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus_id)
        except (AttributeError, pynvml.NVMLError):
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(index)
        self._lock = threading.Lock()
        self._util_sum = 0.0
        self._n = 0
        self._mem_peak = 0.0
        self._stop = threading.Event()
        self._interval = interval
        self._thread = threading.Thread(target=self._run, name="gru4rec-gpu-monitor", daemon=True)
        self._thread.start()

    def sample(self) -> tuple[float, float]:
        """One reading: (utilisation %, memory in use in MiB)."""
        util = self._nvml.nvmlDeviceGetUtilizationRates(self._handle).gpu
        used = self._nvml.nvmlDeviceGetMemoryInfo(self._handle).used / 2**20
        return float(util), float(used)

    def record(self, util: float, used: float) -> None:
        """Add one reading (the sampling thread calls this)."""
        with self._lock:
            self._util_sum += util
            self._n += 1
            self._mem_peak = max(self._mem_peak, used)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            try:
                self.record(*self.sample())
            except self._nvml.NVMLError as exc:  # a device that stops answering ends the sampling
                log.warning("GPU monitoring stopped: %s", exc)
                return

    def read(self) -> tuple[float, float]:
        """(mean utilisation %, peak memory in use MiB) since the last read, then start over."""
        util_now, used_now = self.sample()
        with self._lock:
            util = (self._util_sum + util_now) / (self._n + 1)
            peak = max(self._mem_peak, used_now)
            self._util_sum, self._n, self._mem_peak = 0.0, 0, 0.0
        return util, peak

    def close(self) -> None:
        """Stop sampling and release NVML."""
        self._stop.set()
        self._thread.join(timeout=2 * self._interval + 1)
        try:
            self._nvml.nvmlShutdown()
        except self._nvml.NVMLError:
            pass


class TensorBoardLogger:
    """``fit`` callback writing the per-epoch scalars of the module docstring to ``logdir``.

    ``device``: the training device; on CUDA the GPU's utilisation and memory are sampled too
    (without nvidia-ml-py a warning says so and the other scalars are still written)."""

    def __init__(self, logdir: str | os.PathLike[str], *, device: torch.device | str = "cpu",
                 gpu_interval: float = GPU_SAMPLE_SECONDS) -> None:
        SummaryWriter = import_summary_writer()
        self.logdir = str(logdir)
        self.writer = SummaryWriter(log_dir=self.logdir)
        self.gpu: GpuMonitor | None = None
        device = torch.device(device)
        if device.type == "cuda":
            try:
                self.gpu = GpuMonitor(device, gpu_interval)
            except ImportError as exc:
                log.warning("%s", exc)

    def __call__(self, info: EpochInfo) -> None:
        step = info.epoch
        add = self.writer.add_scalar
        add("train/loss", info.loss, step)
        add("speed/mb_per_s", info.mb_per_s, step)
        add("speed/events_per_s", info.events_per_s, step)
        add("time/epoch_seconds", info.seconds, step)
        add("memory/peak_host_mb", info.peak_host_mb, step)
        if info.peak_device_mb is not None:
            add("memory/peak_device_mb", info.peak_device_mb, step)
        for key, value in (info.valid or {}).items():
            add(f"valid/{key}", value, step)
        if self.gpu is not None:
            util, used = self.gpu.read()
            add("gpu/utilization_pct", util, step)
            add("gpu/memory_used_mb", used, step)
        self.writer.flush()

    def close(self) -> None:
        """Flush and close the event file (and stop the GPU sampling)."""
        if self.gpu is not None:
            self.gpu.close()
            self.gpu = None
        self.writer.close()
