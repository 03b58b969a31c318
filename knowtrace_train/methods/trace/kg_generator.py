"""The KG generator: each document on its own -> triples <title; relation; tail>, batched across questions, cached by content.

One `generate` call serves every uncached document of every question of a step (a document shared by
several questions is generated once). Each document's output is cached under the cache home by the
SHA-256 of (title, text, the generator's model identity, the prompt version, the settings), so a
second run over the same corpus generates nothing. Model text never crashes a run: unparseable lines
are counted, a document without a triple is recorded (`error`), a failed request is retried alone.
"""

from __future__ import annotations

import hashlib
import json
import logging
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from knowtrace_train.data.schema import Passage
from knowtrace_train.generation.base import GenerationError, GenerationRequest, Generator, generate_each
from knowtrace_train.generation.models import configured_model_identity
from knowtrace_train.io import atomic_write_text, cache_home, model_identity
from knowtrace_train.kg import Triplet
from knowtrace_train.methods.trace.prompts import KG_STOP, LABELLED_DOCUMENTS, PROMPT_VERSION, LabelledDocument, render_kg_prompt
from knowtrace_train.methods.trace.ranker import Encoder

log = logging.getLogger(__name__)

_ITEM = re.compile(r"^\s*(?:[-*•]|\d+[.)])?\s*")


@dataclass
class ParsedTriples:
    triples: list[Triplet]
    #: lines that held no triple
    skipped_lines: int = 0


def parse_triples(output: str, max_triples: int) -> ParsedTriples:
    """Triples of a KG generator output: one `<head; relation; tail>` per line (brackets, parentheses
    or none; list markers ignored). A line with fewer than three non-empty parts is skipped and
    counted; more than three parts keep the first as head, the second as relation and the rest as
    tail. Duplicates are dropped; at most `max_triples` are kept."""
    triples: list[Triplet] = []
    seen: set[tuple[str, str, str]] = set()
    skipped = 0
    for line in output.splitlines():
        line = _ITEM.sub("", line).strip()
        if not line:
            continue
        line = line.strip("<>()[]{} \t.")
        parts = [p.strip() for p in line.split(";")]
        if len(parts) < 3 or not all(parts[:2]) or not "; ".join(parts[2:]).strip():
            skipped += 1
            continue
        t = Triplet(parts[0], parts[1], "; ".join(p for p in parts[2:] if p))
        if t.key() in seen:
            continue
        seen.add(t.key())
        if len(triples) < max_triples:
            triples.append(t)
    return ParsedTriples(triples, skipped)


@dataclass
class DocumentTriples:
    """One document's KG generator call: prompt, output, costs, triples, whether it came from the cache."""

    passage: Passage
    prompt: str
    output: str = ""
    prompt_tokens: int = 0
    output_tokens: int = 0
    finish_reason: str = "eos"
    cached: bool = False
    triples: list[Triplet] = field(default_factory=list)
    skipped_lines: int = 0
    error: str | None = None


def content_key(content: dict[str, Any]) -> str:
    """SHA-256 of a JSON-able mapping (keys sorted): the name of a cache entry."""
    return hashlib.sha256(json.dumps(content, sort_keys=True, ensure_ascii=False).encode("utf-8")).hexdigest()


def document_key(passage: Passage, identity: dict[str, Any], settings: dict[str, Any]) -> str:
    """A document's KG cache key: its title and text, the model's identity, the prompt version, the settings."""
    return content_key({"title": passage.title, "text": passage.text, "model": identity, "prompt": PROMPT_VERSION,
                        "settings": settings})


class ContentCache:
    """JSON records (a document's KG output, a selector step's scores) as one file each under `root`,
    named by content key; `root` None keeps nothing. Counts hits and misses."""

    def __init__(self, root: str | Path | None) -> None:
        self.root = None if root is None else Path(root)
        self.hits = 0
        self.misses = 0

    def _path(self, key: str) -> Path:
        assert self.root is not None
        return self.root / key[:2] / f"{key}.json"

    def get(self, key: str) -> dict[str, Any] | None:
        if self.root is None:
            self.misses += 1
            return None
        try:
            record = json.loads(self._path(key).read_text(encoding="utf-8"))
            if not isinstance(record, dict):
                raise ValueError("not a cached record")
        except FileNotFoundError:
            self.misses += 1
            return None
        except (OSError, ValueError) as e:  # a damaged entry is regenerated
            log.warning("trace KG cache: ignoring %s (%s)", self._path(key), e)
            self.misses += 1
            return None
        self.hits += 1
        return record

    def put(self, key: str, record: dict[str, Any]) -> None:
        if self.root is not None:
            path = self._path(key)
            path.parent.mkdir(parents=True, exist_ok=True)
            atomic_write_text(path, json.dumps(record, ensure_ascii=False))

    @property
    def hit_rate(self) -> float | None:
        n = self.hits + self.misses
        return None if n == 0 else self.hits / n


def default_cache(enabled: bool, cache_dir: str | None, kind: str = "kg") -> ContentCache:
    """The cache of `kind` ("kg": documents' triples, "select": selector scores) under the cache home."""
    return ContentCache(cache_home(cache_dir) / "trace" / kind if enabled else None)


def generator_identity(generator: Generator, role: str) -> dict[str, Any]:
    """What names the model that writes a document's triples or scores a selector step: the model (a local folder by
    its files' content, `knowtrace_train.io.model_identity`, as every cache names a model; an alias by its GGUF
    file), the role's adapter the same way and the prompt format; a generator without a GeneratorConfig (a scripted one) by its class."""
    config = getattr(generator, "config", None)
    model = getattr(config, "model", None)
    if not isinstance(model, str):
        return {"generator": type(generator).__qualname__}
    adapter = (getattr(config, "adapters", None) or {}).get(role)
    return {"model": configured_model_identity(model), "adapter": None if adapter is None else model_identity(adapter),
            "prompt_format": getattr(config, "prompt_format", None)}


def pick_demonstrations(doc_embeddings: np.ndarray, demo_embeddings: np.ndarray, n: int) -> list[list[int]]:
    """For each document, the indices of the `n` most similar labelled documents (inner product;
    ties: the earlier one), most similar last, so the nearest demonstration stands next to the document."""
    out = []
    for row in doc_embeddings:
        scores = demo_embeddings @ row
        order = sorted(range(len(scores)), key=lambda i: (-float(scores[i]), i))[:n]
        out.append(order[::-1])
    return out


class KGGenerator:
    """Documents -> their triples, one batched `generate` call for all uncached documents."""

    def __init__(self, *, role: str, demonstrations: int, max_triples: int, max_new_tokens: int, seed: int,
                 cache: ContentCache, encoder: Encoder | None, selection: str = "similar",
                 labelled: Sequence[LabelledDocument] = LABELLED_DOCUMENTS) -> None:
        self.selection = selection
        if demonstrations and selection == "similar" and encoder is None:
            raise ValueError("the KG generator needs an encoder to pick its demonstrations")
        self.role, self.demonstrations, self.max_triples = role, min(demonstrations, len(labelled)), max_triples
        self.max_new_tokens, self.seed, self.cache, self.encoder = max_new_tokens, seed, cache, encoder
        self.labelled = list(labelled)
        self._demo_embeddings: np.ndarray | None = None
        #: documents generated (not from the cache) by this object
        self.generated = 0

    def settings(self) -> dict[str, Any]:
        return {"role": self.role, "demonstrations": self.demonstrations, "selection": self.selection,
                "max_new_tokens": self.max_new_tokens,
                "labelled": [d.title for d in self.labelled]}

    def prompts(self, passages: Sequence[Passage]) -> list[str]:
        if not self.demonstrations or not passages or self.selection == "fixed":
            demos = self.labelled[: self.demonstrations]
            return [render_kg_prompt(p.title, p.text, demos) for p in passages]
        if self._demo_embeddings is None:
            self._demo_embeddings = self.encoder([f"{d.title}. {d.text}" for d in self.labelled])  # type: ignore[misc]
        docs = self.encoder([f"{p.title}. {p.text}" for p in passages])  # type: ignore[misc]
        picks = pick_demonstrations(docs, self._demo_embeddings, self.demonstrations)
        return [render_kg_prompt(p.title, p.text, [self.labelled[i] for i in pick]) for p, pick in zip(passages, picks)]

    def run(self, passages: Sequence[Passage], generator: Generator) -> dict[str, DocumentTriples]:
        """Triples of every passage, by passage id (one entry per distinct id)."""
        unique: dict[str, Passage] = {}
        for p in passages:
            unique.setdefault(p.id, p)
        identity = generator_identity(generator, self.role)
        settings = self.settings()
        out: dict[str, DocumentTriples] = {}
        todo: list[tuple[str, Passage]] = []
        for pid, p in unique.items():
            key = document_key(p, identity, settings)
            record = self.cache.get(key)
            if record is None or not isinstance(record.get("output"), str):
                todo.append((key, p))
                continue
            out[pid] = self._finish(DocumentTriples(
                p, record.get("prompt", ""), record["output"], int(record.get("prompt_tokens", 0)),
                int(record.get("output_tokens", 0)), str(record.get("finish_reason", "eos")), cached=True))
        if todo:
            prompts = self.prompts([p for _, p in todo])
            for (key, p), prompt, doc in zip(todo, prompts, self._generate([p for _, p in todo], prompts, generator)):
                out[p.id] = self._finish(doc)
                if doc.error is None or doc.error.startswith("no triple"):
                    self.cache.put(key, {"prompt": prompt, "output": doc.output, "prompt_tokens": doc.prompt_tokens,
                                         "output_tokens": doc.output_tokens, "finish_reason": doc.finish_reason})
        return out

    def _requests(self, passages: Sequence[Passage], prompts: Sequence[str]) -> list[GenerationRequest]:
        return [GenerationRequest(prompt=q, role=self.role, max_new_tokens=self.max_new_tokens, stop=KG_STOP)
                for q in prompts]

    def _generate(self, passages: Sequence[Passage], prompts: Sequence[str], generator: Generator) -> list[DocumentTriples]:
        requests = self._requests(passages, prompts)
        # one bad request (e.g. a document too long for the context) refuses the batch: then each alone
        completions = generate_each(generator, requests)
        self.generated += len(requests)
        out = []
        for p, q, c in zip(passages, prompts, completions):
            if isinstance(c, GenerationError):
                out.append(DocumentTriples(p, q, error=f"generation failed: {c}"))
            else:
                out.append(DocumentTriples(p, q, c.text, c.prompt_tokens, c.output_tokens, c.finish_reason))
        return out

    def _finish(self, doc: DocumentTriples) -> DocumentTriples:
        if doc.error is None:
            parsed = parse_triples(doc.output, self.max_triples)
            doc.triples, doc.skipped_lines = parsed.triples, parsed.skipped_lines
            if not doc.triples:
                doc.error = "no triple in the KG generator's output"
        return doc
