"""Which GPU a generator uses: under a launcher, each process its own (cuda:LOCAL_RANK), never all on cuda:0.

`torchrun` / `accelerate launch --num_processes N` start N processes on a machine with LOCAL_RANK 0..N-1.
The Trainer (through accelerate's PartialState) puts process k on cuda:(k mod GPUs); the generators follow
the same rule, so rollouts shard across the GPUs and each process generates and trains on one device.
The transformers backend takes the device directly; a vLLM engine starts its own process and uses that
process's first visible GPU, so it is given `CUDA_VISIBLE_DEVICES` naming the process's GPU while it starts.
"""

from __future__ import annotations

import contextlib
import logging
import os
from typing import Iterator, Mapping

log = logging.getLogger(__name__)


def local_rank(env: Mapping[str, str] | None = None) -> int | None:
    """This process's index on its machine under torchrun / accelerate launch (LOCAL_RANK); None when not launched."""
    value = (os.environ if env is None else env).get("LOCAL_RANK", "")
    return int(value) if value.strip() else None


def process_device(device: str, cuda_count: int, rank: int | None) -> str:
    """The torch device a process with local rank `rank` uses for the configured `device`.

    "auto" is cpu without a GPU; with GPUs, and "cuda" without an index, they are cuda:(rank mod GPUs) under a
    launcher (the Trainer's rule) and plain "cuda" (the current device) otherwise. An explicit "cuda:K",
    "cpu" or another device is the user's choice and kept."""
    if device == "auto" and cuda_count == 0:
        return "cpu"
    if device not in ("auto", "cuda") or cuda_count == 0:
        return device
    if rank is None:
        return "cuda"
    if rank >= cuda_count:
        log.warning("local rank %d but %d GPU(s) visible: processes share cuda:%d", rank, cuda_count, rank % cuda_count)
    return f"cuda:{rank % cuda_count}"


def engine_visible_devices(device: str, cuda_visible: str | None, cuda_count: int) -> str | None:
    """The CUDA_VISIBLE_DEVICES value under which a separate engine process (vLLM) sees `device` ("cuda:K", an
    index into this process's visible GPUs) as its first GPU; None where nothing needs pinning ("cuda", cpu)."""
    if not device.startswith("cuda:") or cuda_count == 0:
        return None
    index = int(device.split(":", 1)[1])
    visible = [d.strip() for d in cuda_visible.split(",") if d.strip()] if cuda_visible else []
    if not visible:
        visible = [str(i) for i in range(cuda_count)]
    if index >= len(visible):
        raise ValueError(f"device {device!r}, but only {len(visible)} GPU(s) are visible ({','.join(visible)})")
    return visible[index]


@contextlib.contextmanager
def visible_devices(value: str | None) -> Iterator[None]:
    """Set CUDA_VISIBLE_DEVICES to `value` inside the block (no change for None), then restore it. Processes
    started in the block (a vLLM engine core) see only that GPU; this process's CUDA, once started, is unaffected."""
    if value is None:
        yield
        return
    old = os.environ.get("CUDA_VISIBLE_DEVICES")
    os.environ["CUDA_VISIBLE_DEVICES"] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("CUDA_VISIBLE_DEVICES", None)
        else:
            os.environ["CUDA_VISIBLE_DEVICES"] = old


#: /proc/cpuinfo flags of x86 CPUs that compute in bf16 natively (oneDNN uses them for bf16 matmuls)
NATIVE_BF16_FLAGS = ("avx512_bf16", "amx_bf16")


def cpu_has_native_bf16() -> bool:
    """Whether the CPU has bf16 arithmetic (AVX512-BF16 or AMX-BF16), read from /proc/cpuinfo."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as f:
            for line in f:
                if line.startswith("flags"):
                    return any(flag in line.split() for flag in NATIVE_BF16_FLAGS)
    except OSError:
        pass
    return False
