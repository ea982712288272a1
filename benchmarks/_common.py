"""Helpers shared by the benchmark scripts: statistics, Markdown tables, timing and memory measurement."""

import dataclasses
import json
import os
import platform
import statistics
import tempfile
import time
from collections.abc import Callable

import torch


os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def quantile(values: list[float], q: float) -> float:
    """Linear-interpolation quantile of a list (like numpy's default)."""
    ordered = sorted(values)
    position = q * (len(ordered) - 1)
    lower = int(position)
    upper = min(lower + 1, len(ordered) - 1)
    return ordered[lower] + (ordered[upper] - ordered[lower]) * (position - lower)


def summary(values: list[float]) -> dict[str, float]:
    return {
        "median": statistics.median(values),
        "q25": quantile(values, 0.25),
        "q75": quantile(values, 0.75),
        "min": min(values),
        "max": max(values),
    }


def markdown_table(header: list[str], rows: list[list]) -> str:
    def cell(value):
        return f"{value:.4g}" if isinstance(value, float) else str(value)

    lines = ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"]
    lines += ["| " + " | ".join(cell(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_call(fn: Callable[[], object], device: torch.device) -> float:
    """Seconds of wall time of `fn()`, with the device drained before and after (the benchmark's sync, not S2T's)."""
    synchronize(device)
    start = time.perf_counter()
    fn()
    synchronize(device)
    return time.perf_counter() - start


def peak_memory_bytes(fn: Callable[[], object], device: torch.device) -> tuple[int, int]:
    """Run `fn()` once and return (peak bytes allocated by torch above the level at the start, level at the start).

    CUDA: `torch.cuda.max_memory_allocated` after `reset_peak_memory_stats` (exact, allocator-level).
    CPU: torch's CPU allocator keeps no peak statistic, so the call runs under `torch.profiler` with
    `profile_memory=True`; every allocation and free of a torch tensor is recorded as a `[memory]` event with its size,
    and the peak is the maximum of the running sum of those sizes over the call. Deterministic (not affected by load,
    unlike peak RSS), and it counts torch tensors only: Python objects and allocator caching are not included.
    """
    if device.type == "cuda":
        synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        start = torch.cuda.memory_allocated(device)
        fn()
        synchronize(device)
        return torch.cuda.max_memory_allocated(device) - start, start
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], profile_memory=True) as profiler:
        fn()
    with tempfile.TemporaryDirectory() as directory:
        path = os.path.join(directory, "trace.json")
        profiler.export_chrome_trace(path)
        with open(path) as file:
            events = json.load(file)["traceEvents"]
    allocations = sorted(
        (event["ts"], event["args"]["Bytes"])
        for event in events
        if event.get("name") == "[memory]" and event["args"].get("Device Type", 0) == 0
    )
    running = peak = 0
    for _, size in allocations:
        running += size
        peak = max(peak, running)
    return peak, 0


def grpo_config_like(**settings):
    """The GRPOConfig a user would write for the STAPO run with these `settings`: STAPOConfig's paper defaults where
    they differ from GRPOConfig's (`loss_type="dapo"`, ε_low 0.2, ε_high 0.28, δ = 10, β = 0, ...), then `settings`."""
    from trl import GRPOConfig

    from stapo_trl import STAPOConfig

    grpo_fields = {f.name: f for f in dataclasses.fields(GRPOConfig)}
    paper_defaults = {
        f.name: f.default
        for f in dataclasses.fields(STAPOConfig)
        if f.name in grpo_fields and f.default != grpo_fields[f.name].default
    }
    return GRPOConfig(**{**paper_defaults, **settings})


def describe_machine(device: torch.device) -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo") as file:
            names = [line.split(":", 1)[1].strip() for line in file if line.startswith("model name")]
        cpu = names[0] if names else cpu
    except OSError:
        pass
    load = ""
    if hasattr(os, "getloadavg"):
        load = " load average {:.2f}/{:.2f}/{:.2f} (1/5/15 min);".format(*os.getloadavg())
    text = (
        f"{cpu}; {os.cpu_count()} logical CPUs;{load} torch {torch.__version__}, "
        f"{torch.get_num_threads()} intra-op threads"
    )
    if device.type == "cuda":
        text += f"; GPU {torch.cuda.get_device_name(device)}"
    return text
