"""Kernels per training step and device microseconds per step, by backend, as JSON lines.

    python -m benchmarks.gpu.gpu_profile --config retailrocket --device cuda              # PyTorch ops and Triton
    python -m benchmarks.gpu.gpu_profile --config diginetica --device cuda --backends torch

For each backend (``torch``: the PyTorch ops; ``triton``: the fused GPU kernels) it builds a
trainer, warms it up, then

* profiles ``--steps`` eager steps with ``torch.profiler`` and counts the device kernels
  (``kernels_per_step``; memory copies and sets counted apart) and their summed device time
  (``device_us_per_step``): what one step asks of the GPU, however it is launched;
* times ``--steps`` steps replayed from one captured CUDA graph (``replay_us_per_step``, CUDA
  events): what the epoch loop gets, launch overhead gone.

On a machine without CUDA it counts what a GPU would launch, without device times
(``kernels_per_step_estimate``): the step's PyTorch operators that compute (views, reshapes and
allocations, which launch nothing, left out) plus its Triton launches, which run in Triton's
interpreter there (``TRITON_INTERPRET=1``, set by ``benchmarks/gpu/__init__.py`` when no CUDA device is present).
"""
from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Iterator
from contextlib import contextmanager

import torch

from benchmarks.workloads import add_config_arguments, config_of, load_sessions
from gru4rec.config import Config
from gru4rec.kernels.gpu import counter_driven_step
from gru4rec.network.gru import GRU4RecNet
from gru4rec.training.backend import select_backend
from gru4rec.training.batching import build_schedule
from gru4rec.training.trainer import Trainer

#: Profiler event names that are copies or fills, not kernels of the step's arithmetic.
_MEMORY = ("memcpy", "memset", "Memcpy", "Memset")
#: PyTorch operators that launch no kernel: views, metadata and allocations.
_NO_KERNEL = {
    "aten::view", "aten::reshape", "aten::_reshape_alias", "aten::slice", "aten::select", "aten::t", "aten::transpose",
    "aten::as_strided", "aten::diagonal", "aten::squeeze", "aten::unsqueeze", "aten::expand", "aten::narrow",
    "aten::detach", "aten::alias", "aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty",
    "aten::lift_fresh", "aten::resolve_conj", "aten::resolve_neg", "aten::_unsafe_view", "aten::view_as",
    "aten::result_type", "aten::is_nonzero", "aten::item", "aten::_local_scalar_dense", "aten::to", "aten::_to_copy",
    "aten::split", "aten::chunk", "aten::unbind", "aten::numpy_T", "aten::contiguous", "aten::flatten",
    "aten::resize_", "aten::set_", "aten::zeros", "aten::ones", "aten::new_zeros", "aten::full", "aten::scalar_tensor",
}


_TRITON_LAUNCH = "triton_launch"


def _inside_launch(event) -> bool:
    parent = event.cpu_parent
    while parent is not None:
        if parent.name == _TRITON_LAUNCH:
            return True
        parent = parent.cpu_parent
    return False


@contextmanager
def counting_triton_launches() -> Iterator[list[int]]:
    """Count the Triton launches made inside (the interpreter's, on the CPU)."""
    count = [0]
    try:
        from triton.runtime.interpreter import InterpretedFunction
    except ImportError:  # no Triton: nothing to count
        yield count
        return
    original = InterpretedFunction.run

    def run(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        count[0] += 1
        with torch.profiler.record_function(_TRITON_LAUNCH):  # the interpreter's own operators are not the step's
            return original(self, *args, **kwargs)

    InterpretedFunction.run = run  # type: ignore[method-assign]
    try:
        yield count
    finally:
        InterpretedFunction.run = original  # type: ignore[method-assign]


def estimate_cpu_kernels(events, triton_launches: int, steps: int) -> dict:
    """What a GPU would launch per step, from the CPU profile: the outermost computing PyTorch
    operators (one kernel each: ``addmm`` counts once, not with the operators it calls; a view or
    an allocation counts nothing, but a copy or fill it calls does) plus the Triton launches."""

    def computes(e) -> bool:
        return e.device_type == torch.autograd.DeviceType.CPU and e.name.startswith("aten::") and e.name not in _NO_KERNEL

    def outermost(e) -> bool:
        parent = e.cpu_parent
        while parent is not None:
            if computes(parent):
                return False
            parent = parent.cpu_parent
        return True

    computing = [e for e in events if computes(e) and outermost(e) and not _inside_launch(e)]
    by_name: dict[str, int] = {}
    for e in computing:
        by_name[e.name] = by_name.get(e.name, 0) + 1
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:15]
    return {
        "kernels_per_step_estimate": round((len(computing) + triton_launches) / steps, 2),
        "torch_ops_per_step": round(len(computing) / steps, 2),
        "triton_launches_per_step": round(triton_launches / steps, 2),
        "top_ops": {name: round(n / steps, 2) for name, n in top},
    }


def count_kernels(events, steps: int) -> dict:
    """Kernels per step and their device µs per step from a profiler's event list."""
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
    memory = [e for e in kernels if any(m in e.name for m in _MEMORY)]
    compute = [e for e in kernels if not any(m in e.name for m in _MEMORY)]
    by_name: dict[str, int] = {}
    for e in compute:
        by_name[e.name] = by_name.get(e.name, 0) + 1
    top = sorted(by_name.items(), key=lambda kv: -kv[1])[:12]
    return {
        "kernels_per_step": round(len(compute) / steps, 2),
        "memory_ops_per_step": round(len(memory) / steps, 2),
        "device_us_per_step": round(sum(e.device_time for e in compute) / steps, 1),
        "top_kernels": {name[:60]: round(n / steps, 2) for name, n in top},
    }


def profile(config: Config, sessions, support, device: torch.device, backend_name: str, steps: int, warmup: int) -> dict:
    # on the CPU: scratch rows and no CPU kernels, as on a GPU (the Triton ops in the interpreter)
    switches = {"fused_gpu": backend_name == "triton", "unique_rows": False}
    if device.type == "cuda":
        switches["graph_replay"] = False
    else:
        switches["cpu_kernels"] = False
    backend = select_backend(device, **switches)
    net = GRU4RecNet(len(support), config, generator=torch.Generator().manual_seed(config.seed)).to(device)
    trainer = Trainer(net, config, support, backend=backend)
    schedule = build_schedule(sessions.items, sessions.offsets, config.batch_size, config.n_sample, device)
    if schedule.n_steps < warmup + 2 * steps:
        raise SystemExit(f"the data gives only {schedule.n_steps} steps; lower --steps/--warmup")
    losses = torch.zeros(schedule.n_steps, device=device, dtype=torch.float64)

    def accumulate(loss: torch.Tensor, t: torch.Tensor) -> None:
        losses.index_copy_(0, t.view(1), loss.view(1).to(torch.float64))

    prepare, body = counter_driven_step(trainer, schedule, accumulate)  # the replayed step's own form
    for t in range(warmup):
        prepare(t)
        body()
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
        torch.cuda.synchronize(device)
    with counting_triton_launches() as launches, torch.profiler.profile(activities=activities) as prof:
        for t in range(warmup, warmup + steps):
            prepare(t)
            body()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
    out = {"config_layers": list(config.layers), "batch_size": config.batch_size, "n_sample": config.n_sample,
           "loss": config.loss, "backend": backend.name, "device": str(device), "steps": steps}
    if device.type != "cuda":
        out.update(estimate_cpu_kernels(prof.events(), launches[0], steps))
        return out
    out.update(count_kernels(prof.events(), steps))
    # The same steps replayed from one captured graph, timed with CUDA events.
    first = warmup + steps
    side = torch.cuda.Stream(device)
    side.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(side):
        prepare(first)
        body()
    torch.cuda.current_stream(device).wait_stream(side)
    torch.cuda.synchronize(device)
    graph = torch.cuda.CUDAGraph()
    if trainer.uses_dropout:
        graph.register_generator_state(trainer.dropout_gen)
    with torch.cuda.graph(graph):
        body()
    times = []
    for _ in range(3):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for t in range(first, first + steps):
            prepare(t)
            graph.replay()
        end.record()
        torch.cuda.synchronize(device)
        times.append(1e3 * start.elapsed_time(end) / steps)
    out["replay_us_per_step"] = round(statistics.median(times), 1)
    out["replay_mb_per_s"] = round(1e6 / out["replay_us_per_step"], 0)
    out["final_loss_finite"] = bool(torch.isfinite(losses[: first + steps]).all())
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_config_arguments(parser, config="retailrocket", n_items=50_000)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backends", nargs="+", default=["torch", "triton"], choices=("torch", "triton"))
    parser.add_argument("--steps", type=int, default=50)
    parser.add_argument("--warmup", type=int, default=20)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    base = config_of(args)
    sessions, support = load_sessions(args.data, args.n_items, base.seed)
    for name in args.backends:
        print(json.dumps(profile(base, sessions, support, device, name, args.steps, args.warmup)), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
