"""LoRA training throughput on templated KnowTrace records: what the doctor's training checks measure
(knowtrace_train/commands/doctor.py) and scripts/bench/bench_train.py compares against TRL's defaults.

`knowtrace_records` gives exploration and completion records shaped like the self-training loop's SFT records;
`run_ours` trains one optimizer step (or one packed epoch) on them and returns tokens/s; `flops_figures` the
achieved TFLOP/s by the 6N estimate (N: `matmul_params`) and, on CUDA, the share of the device's bf16 peak.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path

from knowtrace_train.kg import GuidancePair, Triplet
from knowtrace_train.methods.knowtrace.outputs import completion as completion_text
from knowtrace_train.methods.knowtrace.outputs import exploration_answer, exploration_guidance

EXPLORE_INSTRUCTION = """Answer a question that needs several retrieval steps. The knowledge collected so far is given as triplets (subject entity; relation; object entity).
First judge: Whether the given knowledge triplets are sufficient for answering: Yes or No
If Yes, write "Thought:" with your reasoning, then "Answer:" with the final answer.
If No, write "Retrieval Guidance:" and then one line per entity to retrieve next:
- Entity name: the concrete knowledge to find about this entity"""

EXPLORE_EXEMPLARS = """Question: Which was founded first, Harlow Press or Minto Records?
Knowledge triplets:
(none)
Whether the given knowledge triplets are sufficient for answering: No
Retrieval Guidance:
- Harlow Press: the year it was founded
- Minto Records: the year it was founded

Question: What language is spoken in the country of Lake Verrin?
Knowledge triplets:
(Lake Verrin; is located in; Doravia)
(Doravia; has official language; Doravian)
Whether the given knowledge triplets are sufficient for answering: Yes
Thought: Lake Verrin lies in Doravia, whose official language is Doravian.
Answer: Doravian"""

COMPLETE_INSTRUCTION = """Extract from the documents the knowledge triplets that the guidance asks for about the input entity.
Write one triplet per line as (subject entity; relation; object entity), with a concrete relation.
Never write vague triplets such as "not found" or "N/A". Add no explanation."""

COMPLETE_EXEMPLAR = """Documents:
[Odile Farrant] Odile Farrant (born 1902 in Castelbrun) founded the Zentor bicycle company.
[Castelbrun] Castelbrun is a river port on the Vesse.
Entity: Odile Farrant
Guidance: the city where she was born
Triplets:
(Odile Farrant; was born in; Castelbrun)
(Odile Farrant; was born in the year; 1902)"""

SYLLABLES = "ka lo mer vin dra sel tor an bel cor dun fa gri hal is jor ken lum nor pra ros sta tul val wen".split()
RELATIONS = [
    ("was founded by", "the founder of {e}"), ("was born in", "the city where {e} was born"),
    ("is located in", "the country where {e} is located"), ("was directed by", "the director of {e}"),
    ("has headquarters in", "the city of the headquarters of {e}"), ("was written by", "the author of {e}"),
    ("is married to", "the spouse of {e}"), ("was released in", "the year {e} was released"),
]


def _name(rng: random.Random, parts: int = 2) -> str:
    return " ".join("".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 3))).title() for _ in range(parts))


def _passage(rng: random.Random, subject: str, relation: str, obj: str) -> str:
    filler = [
        f"{subject} is widely discussed in regional histories and several later surveys.",
        f"In later years, {subject} was the subject of a retrospective by {_name(rng)}.",
        f"Records from {rng.randint(1850, 2010)} describe {subject} in some detail.",
        f"Critics compared {subject} with the work of {_name(rng)}, though the comparison is disputed.",
    ]
    rng.shuffle(filler)
    return f"[{subject}] {subject} {relation} {obj}. " + " ".join(filler[: rng.randint(2, 4)])


def knowtrace_records(n: int, seed: int = 0) -> list[dict]:
    """Templated exploration and completion records shaped like the self-training loop's SFT records."""
    rng = random.Random(seed)
    records = []
    for i in range(n):
        hops = [(_name(rng), *rng.choice(RELATIONS)) for _ in range(3)]
        chain = [(hops[0][0], hops[0][1], _name(rng)), None, None]
        chain[1] = (chain[0][2], hops[1][1], _name(rng))
        chain[2] = (chain[1][2], hops[2][1], _name(rng))
        if i % 2 == 0:  # knowledge exploration
            known = chain[: rng.randint(0, 3)]
            g0, g1, g2 = (next(g for rr, g in RELATIONS if rr == t[1]) for t in chain)
            question = "What is " + g2.format(e=g1.format(e=g0.format(e=chain[0][0]))) + "?"
            kg = "\n".join(Triplet(*t).render() for t in known) or "(none)"
            prompt = f"{EXPLORE_INSTRUCTION}\n\n{EXPLORE_EXEMPLARS}\n\nQuestion: {question}\nKnowledge triplets:\n{kg}"
            if len(known) == 3:
                out = exploration_answer(
                    " ".join(f"{s} {r} {o}." for s, r, o in known), known[-1][2]
                )
            else:
                s, r, _ = chain[len(known)]
                guidance = next(g for rr, g in RELATIONS if rr == r).format(e=s)
                pairs = [GuidancePair(s, guidance)] + (
                    [GuidancePair(_name(rng), "the year it was founded")] if rng.random() < 0.3 else []
                )
                out = exploration_guidance(pairs)
            records.append({"prompt": prompt, "completion": out})
        else:  # knowledge completion
            s, r, o = chain[rng.randint(0, 2)]
            docs = [_passage(rng, s, r, o)] + [
                _passage(rng, _name(rng), rng.choice(RELATIONS)[0], _name(rng)) for _ in range(rng.randint(2, 4))
            ]
            rng.shuffle(docs)
            guidance = next(g for rr, g in RELATIONS if rr == r).format(e=s)
            prompt = (
                f"{COMPLETE_INSTRUCTION}\n\n{COMPLETE_EXEMPLAR}\n\nDocuments:\n" + "\n".join(docs)
                + f"\nEntity: {s}\nGuidance: {guidance}\nTriplets:"
            )
            triplets = [Triplet(s, r, o)] + ([Triplet(s, "is described in", "regional histories")] if rng.random() < 0.3 else [])
            records.append({"prompt": prompt, "completion": completion_text(triplets)})
    return records


#: dense (no sparsity) bf16 tensor-core peaks in TFLOP/s from NVIDIA's data sheets, matched in order against
#: torch.cuda.get_device_name() (first match wins: "H100 PCIe" before "H100")
PEAK_BF16_TFLOPS = (
    ("H200", 989.0),
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM5 (the HBM3 80GB part)
    ("A100", 312.0),
)


def peak_bf16_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a CUDA device by its name, None where the table does not know it."""
    for key, peak in PEAK_BF16_TFLOPS:
        if key.lower() in device_name.lower():
            return peak
    return None


def meta_model(model_dir: Path):
    """An empty (meta-device) copy of the model in `model_dir`: its modules and shapes, no weights read."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    with torch.device("meta"):
        return AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(str(model_dir)))


def matmul_params(model_dir: Path) -> int:
    """N of the 6N estimate: the weights of every linear layer (LM head included, also when it is tied to the
    input embedding), counted on an empty (meta) copy of the model."""
    import torch

    return sum(m.weight.numel() for m in meta_model(model_dir).modules() if isinstance(m, torch.nn.Linear))


def flops_figures(tokens: int, seconds: float, n_params: int) -> dict:
    """Achieved TFLOP/s by the 6N estimate and, on CUDA, the utilisation of the device's bf16 peak."""
    import torch

    tflops = 6 * n_params * tokens / seconds / 1e12 if seconds > 0 else 0.0
    out: dict = {"tflops_6n": round(tflops, 4)}
    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        peak = peak_bf16_tflops(name)
        out.update(device=name, peak_bf16_tflops=peak, utilisation=round(tflops / peak, 4) if peak else None)
    return out


#: The LoraTrainConfig defaults of the measured figures (docs/training.md), before they became the default
#: run's (batch 4 x 1, max_length 1024, rate 3e-4): passed explicitly so the benchmark measures what it did
#: (the per-pass batch is --batch, 1 as measured on CPUs).
OURS_MEASURED = {"max_length": 2048, "learning_rate": 1e-4}


def run_ours(model_dir: Path, records: list[dict], n_records: int, seed: int, precision: str = "auto",
             batch: int = 1, n_params: int = 0, pack: int = 0) -> dict:
    """One optimizer step over `n_records` records, `batch` per forward pass; with `pack`, one epoch of the
    `n_records` records packed into rows of up to `pack` tokens, `batch` rows per pass and per step."""
    from knowtrace_train.train.lora import LoraTrainConfig, train_role

    if pack:
        config = LoraTrainConfig(**{**OURS_MEASURED, "max_length": pack}, epochs=1, seed=seed, logging_steps=1,
                                 per_device_batch_size=batch, gradient_accumulation_steps=1, precision=precision,
                                 packing=True)
    else:
        config = LoraTrainConfig(
            **OURS_MEASURED, max_steps=1, seed=seed, logging_steps=1, per_device_batch_size=batch,
            gradient_accumulation_steps=max(1, n_records // batch), precision=precision,
        )
    with tempfile.TemporaryDirectory() as out:
        r = train_role(model_dir, records[:n_records], Path(out) / "adapter", config, role="bench")
    return {
        "settings": {"precision": r.precision, "gradient_checkpointing": config.gradient_checkpointing,
                     "per_device_batch_size": config.per_device_batch_size, "padding_free": config.padding_free,
                     "packing": config.packing, "gradient_accumulation_steps": config.gradient_accumulation_steps,
                     "max_length": config.max_length, "steps": r.steps},
        "tokens": r.tokens, "completion_tokens": r.completion_tokens, "seconds": round(r.seconds, 2),
        "tok_s": round(r.tokens_per_second, 2), "completion_tok_s": round(r.completion_tokens / r.seconds, 2),
        **flops_figures(r.tokens, r.seconds, n_params),
    }
