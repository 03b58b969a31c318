"""Model output -> typed exploration decisions and completion triplets; never raises on model text.

Reads back exactly what `knowtrace_train.methods.knowtrace.outputs` writes, and tolerates what small models
really write: numbered or starred lines, commas or pipes instead of semicolons, missing
parentheses, extra prose, repeated lines, the paper's own variant headers (Appendix F).
Vague triplets ("not found", "N/A", "none", template placeholders) are rejected, and every
triplet of a completion is kept (not only the first line).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field
from typing import Any, Callable

from knowtrace_train.kg import GuidancePair, Triplet, normalize_entity

# -- results -------------------------------------------------------------------------


@dataclass
class ExplorationResult:
    """An exploration output: the judgement (None when absent), the thought and answer when
    it concludes, the guidance pairs when it asks for more. `error` says why the output
    cannot be used (then the engine ends the question with a recorded reason)."""

    sufficient: bool | None = None
    thought: str | None = None
    answer: str | None = None
    pairs: list[GuidancePair] = field(default_factory=list)
    #: guidance lines that were dropped (vague, placeholder or empty)
    rejected: list[str] = field(default_factory=list)
    error: str | None = None

    @property
    def answered(self) -> bool:
        return self.error is None and bool(self.sufficient) and bool(self.answer)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["pairs"] = [[p.entity, p.guidance] for p in self.pairs]
        return d


@dataclass
class CompletionResult:
    """A completion output: the triplets read from it, the lines that gave no usable triplet,
    and `error` when a non-empty output gave none (an empty output is a valid "nothing found")."""

    triplets: list[Triplet] = field(default_factory=list)
    rejected: list[str] = field(default_factory=list)
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {
            "triplets": [[t.subject, t.relation, t.object] for t in self.triplets],
            "rejected": list(self.rejected),
            "error": self.error,
        }


# -- shared helpers ------------------------------------------------------------------

#: Leading list markers: "-", "*", "•", "1.", "1)", "(1)", "Triplet 1:", "Entity 2 -".
_BULLET = re.compile(
    r"^\s*(?:[-*•·–—>]+\s*|\(?\d{1,3}[.)\]:]\s*|(?:triple(?:t)?|entity|pair|step)\s*\d{1,3}\s*[:.)\-]\s*)+",
    re.IGNORECASE,
)
_BULLET_ONLY_DASH = re.compile(r"^\s*[-*•·–—]\s*")

_VAGUE = {
    "", "none", "n/a", "na", "n.a.", "null", "nil", "nothing", "unknown", "not found", "not available",
    "not mentioned", "not specified", "not provided", "not given", "not stated", "not known",
    "no information", "no info", "no data", "unspecified", "?", "-", "--", "...", "…", "tbd",
    "subject", "subject entity", "relation", "object", "object entity", "entity", "entity name",
    "input entity name",
}
_VAGUE_PREFIX = re.compile(
    r"^(?:not (?:found|mentioned|available|specified|provided|given|stated|known|applicable)"
    r"|no (?:information|info|data|relevant|mention)|unknown|none (?:found|given|mentioned)"
    r"|information not|cannot be determined|can ?not be found|it is not)\b",
    re.IGNORECASE,
)
_PLACEHOLDER = re.compile(r"^entity name(?: \d+)?$|^input entity name$", re.IGNORECASE)


def is_vague(value: str) -> bool:
    """A field no triplet or guidance pair should carry: empty, "not found", "N/A", "none",
    or the template's own placeholder words."""
    v = normalize_entity(value)
    return v in _VAGUE or bool(_VAGUE_PREFIX.match(v)) or bool(_PLACEHOLDER.match(v))


def _clean_field(s: str) -> str:
    s = s.strip()
    # Markdown bold / quotes / backticks around a whole field.
    for _ in range(3):
        s2 = s.strip().strip("*`").strip()
        if len(s2) >= 2 and s2[0] == s2[-1] and s2[0] in "\"'":
            s2 = s2[1:-1].strip()
        if s2 == s:
            break
        s = s2
    return " ".join(s.split())


# -- exploration ---------------------------------------------------------------------

_JUDGEMENT = re.compile(r"sufficient[^\n:]*?:\s*\**\s*(yes|no)\b", re.IGNORECASE)
_JUDGEMENT_LOOSE = re.compile(r"^\s*(?:judg(?:e)?ment\s*:\s*)?(yes|no)\s*[.!]?\s*$", re.IGNORECASE)
_THOUGHT = re.compile(r"^\s*\**\s*thought\s*\**\s*:\s*\**\s*", re.IGNORECASE)
_ANSWER = re.compile(r"^\s*\**\s*(?:final\s+)?answer\s*\**\s*:\s*\**\s*", re.IGNORECASE)
#: "Answer:" inside a thought line (capitalised, after a sentence or at the start).
_INLINE_ANSWER = re.compile(r"(?:^|(?<=[.!?\s*]))\**\s*(?:Final |final )?Answer\s*\**\s*:")
_GUIDANCE_HEADER = re.compile(
    r"^\s*\**\s*(?:retrieval\s+guidance|what entity-relation pairs to retrieve[^:]*)\s*\**\s*:\s*\**\s*",
    re.IGNORECASE,
)
#: Lines that end the guidance list: another field of the output.
_SECTION = re.compile(r"^\s*\**\s*(?:whether|thought|answer)\b[^:]*:", re.IGNORECASE)
#: Lines that end the output: the model went on into a next prompt (an exemplar's header).
_PROMPT_SECTION = re.compile(
    r"^\s*(?:question|knowledge triplets|documents|input entity|structured knowledge)\b[^:]*:", re.IGNORECASE
)


def _split_pair(line: str) -> tuple[str, str] | None:
    """`Entity: guidance` -> (entity, guidance). The split is at the last ": " so that
    entity names with colons ("Star Wars: Episode IV") survive; then at the first ":",
    then at " - " / " – "."""
    if ": " in line:
        i = line.rfind(": ")
        return line[:i], line[i + 2 :]
    if ":" in line:
        i = line.find(":")
        return line[:i], line[i + 1 :]
    for sep in (" - ", " – ", " — "):
        if sep in line:
            i = line.find(sep)
            return line[:i], line[i + len(sep) :]
    return None


def _parse_pair_line(line: str, require_bullet: bool) -> GuidancePair | str | None:
    """A guidance line -> a pair; a rejected line -> its text; not a guidance line -> None."""
    has_bullet = bool(_BULLET_ONLY_DASH.match(line)) or bool(re.match(r"^\s*\(?\d{1,3}[.)]", line))
    if require_bullet and not has_bullet:
        return None
    body = _BULLET.sub("", line, count=1).strip()
    if not body:
        return None
    split = _split_pair(body)
    if split is None:
        return line.strip()
    entity = _clean_field(split[0])
    guidance = _clean_field(split[1])
    # "- Entity: Blue Harbor, Guidance: ..." is not worth reconstructing; reject it clearly.
    if is_vague(entity) or is_vague(guidance) or len(entity) > 200:
        return line.strip()
    return GuidancePair(entity, guidance)


def _lines(text: str, cut: bool, unfinished: Callable[[str], bool]) -> list[str]:
    """The output's lines; with `cut` (the model hit its token limit) the last line is dropped
    when `unfinished(line)` says so and it is not the only line with content."""
    lines = text.replace("\r\n", "\n").replace("\r", "\n").split("\n")
    if cut:
        while lines and not lines[-1].strip():
            lines.pop()
        if len([x for x in lines if x.strip()]) > 1 and unfinished(lines[-1]):
            lines.pop()
    return lines


def _unfinished_guidance(line: str) -> bool:
    """A guidance line broken off (the answer and thought lines are kept: better cut than none)."""
    return bool(_BULLET_ONLY_DASH.match(line) or re.match(r"^\s*\(?\d{1,3}[.)]", line))


def _unfinished_triplet(line: str) -> bool:
    return not line.rstrip().rstrip(";.,").endswith(")")


def parse_exploration(text: str, cut: bool = False) -> ExplorationResult:
    """Read a knowledge exploration output. `cut`: the output was cut at the token limit, so
    an unfinished last line (a guidance line broken mid-word) is not read. Never raises."""
    try:
        return _parse_exploration(text if isinstance(text, str) else "", cut)
    except Exception as e:  # noqa: BLE001 - the contract is: model text never crashes a run
        return ExplorationResult(error=f"parser failure: {e!r}")


def _parse_exploration(text: str, cut: bool = False) -> ExplorationResult:
    res = ExplorationResult()
    lines = _lines(text, cut, _unfinished_guidance)

    thought_lines: list[str] | None = None
    in_guidance = False
    seen_pairs: set[tuple[str, str]] = set()
    for raw in lines:
        line = raw.strip()
        if not line:
            continue
        if _PROMPT_SECTION.match(line):
            break
        m = _JUDGEMENT.search(line)
        if m and res.sufficient is None:
            res.sufficient = m.group(1).lower() == "yes"
            in_guidance = False
            thought_lines = None
            # "…: No Retrieval Guidance:" on one line: go on with the rest.
            rest = line[m.end() :].strip()
            if re.match(r"^or\b", rest, re.IGNORECASE):  # the template copied: "Yes or No"
                res.sufficient = None
                continue
            if not rest:
                continue
            line = rest
        elif res.sufficient is None and not in_guidance and _JUDGEMENT_LOOSE.match(line):
            res.sufficient = _JUDGEMENT_LOOSE.match(line).group(1).lower() == "yes"  # type: ignore[union-attr]
            continue
        if _THOUGHT.match(line):
            in_guidance = False
            body = _THOUGHT.sub("", line, count=1).strip()
            inline = _INLINE_ANSWER.search(body)
            if inline:  # "Thought: ... Answer: X" on one line
                line = body[inline.start() :].strip()
                body = body[: inline.start()].strip()
            if res.thought is None:
                thought_lines = [body]
            if not inline:
                continue
        if _ANSWER.match(line):
            if res.answer is None:
                ans = _clean_field(_ANSWER.sub("", line, count=1))
                res.answer = ans or None
                if thought_lines is not None and res.thought is None:
                    res.thought = " ".join(x for x in thought_lines if x) or None
            thought_lines = None
            in_guidance = False
            continue
        if _GUIDANCE_HEADER.match(line):
            in_guidance = True
            thought_lines = None
            line = _GUIDANCE_HEADER.sub("", line, count=1).strip()
            if not line:
                continue
        elif in_guidance and _SECTION.match(line):
            in_guidance = False
        if thought_lines is not None:
            thought_lines.append(line)
            continue
        parsed = _parse_pair_line(line, require_bullet=not in_guidance)
        if parsed is None:
            continue
        if isinstance(parsed, str):
            if in_guidance:
                res.rejected.append(parsed)
            continue
        key = (normalize_entity(parsed.entity), normalize_entity(parsed.guidance))
        if key in seen_pairs:
            continue
        seen_pairs.add(key)
        res.pairs.append(parsed)
    if thought_lines is not None and res.thought is None:
        res.thought = " ".join(x for x in thought_lines if x) or None

    # Decide what the output means.
    if res.sufficient is None:
        if res.answer:
            res.sufficient = True
        elif res.pairs:
            res.sufficient = False
    if res.sufficient is True and not res.answer:
        if res.pairs:
            res.error = "judgement Yes without an answer (guidance pairs given instead)"
        else:
            res.error = "judgement Yes without an answer"
    elif res.sufficient is False and not res.pairs:
        res.error = "judgement No without any usable guidance pair"
    elif res.sufficient is None:
        res.error = "no judgement, answer or guidance pair found" if text.strip() else "empty output"
    return res


# -- completion ----------------------------------------------------------------------

_COMPLETION_HEADER = re.compile(r"^\s*\**\s*(?:structured\s+)?knowledge\s+tripl\w*(?:\(s\))?\s*\**\s*:\s*", re.IGNORECASE)
_COMPLETION_END = re.compile(r"^\s*(?:documents|input entity|question)\b[^:]*:", re.IGNORECASE)


def _groups(line: str) -> list[str]:
    """Top-level parenthesised groups of a line; an unclosed group runs to the line's end."""
    out: list[str] = []
    depth = 0
    start = -1
    for i, ch in enumerate(line):
        if ch == "(":
            if depth == 0:
                start = i + 1
            depth += 1
        elif ch == ")" and depth > 0:
            depth -= 1
            if depth == 0:
                out.append(line[start:i])
    if depth > 0:
        out.append(line[start:])
    return out


def _strip_unbalanced(body: str) -> str:
    """Drop trailing `;`/`.` and a parenthesis that has no partner at either end."""
    body = body.strip().rstrip(";.").strip()
    if body.startswith("(") and body.count("(") > body.count(")"):
        body = body[1:]
    if body.endswith(")") and body.count(")") > body.count("("):
        body = body[:-1]
    return body.strip()


def _split_triplet(body: str) -> list[str] | None:
    for sep in (";", "|", "\t", ","):
        if sep in body:
            parts = body.split(sep)
            if len(parts) >= 3:
                # Extra separators belong to the object ("Glasgow, Scotland").
                return [parts[0], parts[1], sep.join(parts[2:])]
    for sep in (" -> ", " – ", " - "):
        if body.count(sep) >= 2:
            parts = body.split(sep)
            return [parts[0], parts[1], sep.join(parts[2:])]
    for sep in (";", "|"):
        if body.count(sep) == 1:
            # "(Letters from Solene; was founded in 1969)": relation and object run together;
            # they part after the relation's first preposition.
            subject, rest = body.split(sep)
            rest = rest.strip()
            m = _RELATION_END.search(rest) or _COPULA.match(rest)
            if m:
                return [subject, rest[: m.end()], rest[m.end() :]]
    return None


#: A relation that is only a leading "is"/"was"/"has" ("(S/S; was a South Korean boy group)").
#: The object must read as a noun phrase: an article, a capital or a digit first.
_COPULA = re.compile(r"^(?i:is|was|are|were|has|had|have)\b(?=\s+(?:(?i:a|an|the)\s|[A-Z0-9]))")


#: The first preposition that ends a relation inside "relation object" ("was born in Castelbrun");
#: it is never the first word, and an object must follow it.
_RELATION_END = re.compile(
    r"(?<=\S)\s+(?:in|by|at|of|on|to|from|as|for|with|into|during|since|after|before|under)\b(?=\s+\S)",
    re.IGNORECASE,
)


def _triplet_from(body: str) -> Triplet | str:
    parts = _split_triplet(body)
    if parts is None:
        return "not a (subject; relation; object) triplet"
    s, r, o = (_clean_field(p) for p in parts)
    if not (s and r and o):
        return "empty field"
    if any(is_vague(x) for x in (s, r, o)):
        return "vague field"
    return Triplet(s, r, o)


def parse_completion(text: str, cut: bool = False) -> CompletionResult:
    """Read a knowledge completion output: every `(subject; relation; object)` in it. `cut`: the
    output was cut at the token limit, so an unfinished last line ("(A; born in; 19") is not
    read. Never raises."""
    try:
        return _parse_completion(text if isinstance(text, str) else "", cut)
    except Exception as e:  # noqa: BLE001 - model text never crashes a run
        return CompletionResult(error=f"parser failure: {e!r}")


def _parse_completion(text: str, cut: bool = False) -> CompletionResult:
    res = CompletionResult()
    seen: set[tuple[str, str, str]] = set()
    for raw in _lines(text, cut, _unfinished_triplet):
        line = raw.strip()
        if not line:
            continue
        if _COMPLETION_END.match(line):
            break
        if _COMPLETION_HEADER.match(line):
            line = _COMPLETION_HEADER.sub("", line, count=1).strip()
            if not line:
                continue
        groups = [g for g in _groups(line) if _split_triplet(g) is not None]
        if not groups:
            # No parenthesised triplet: the line itself, list marker and trailing marks removed.
            groups = [_strip_unbalanced(_BULLET.sub("", line, count=1))]
        found = [t for t in map(_triplet_from, groups) if isinstance(t, Triplet)]
        if not found:
            res.rejected.append(line)
        for t in found:
            if t.key() not in seen:
                seen.add(t.key())
                res.triplets.append(t)
    if not res.triplets and text.strip():
        res.error = "no usable triplet in the output"
    return res


def parse_kg_text(text: str) -> str:
    """A KG-to-Text output: its sentences on one line (empty when the model wrote nothing)."""
    if not isinstance(text, str):
        return ""
    lines = []
    for raw in text.replace("\r", "\n").split("\n"):
        line = raw.strip()
        if not line:
            continue
        if re.match(r"^(?:knowledge triplets|question|documents)\b[^:]*:", line, re.IGNORECASE):
            break
        lines.append(line)
    return " ".join(" ".join(lines).split())
