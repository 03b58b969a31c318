"""Questions over the synthetic world: bridge chains of 1-4 hops and comparisons, with gold evidence.

A bridge question names one entity and asks for the end of a chain of functional relations
from it ("Where was the director of X born?"); a comparison names two entities and asks which
has the earlier year at the end of a chain, or whether both chains end at the same entity.
Only the named entities appear in a question: every other entity must be found by retrieval.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, replace

from knowtrace_train.data.schema import GoldEvidence, Passage, QAItem, SubQuestion

from .kb import COUNTRY_MERGES, KIND_NOUN, RELATIONS, YEAR, KnowledgeBase, Relation, object_name

log = logging.getLogger(__name__)

#: (type, hops) -> share of the questions of every split.
CATEGORIES: dict[tuple[str, int], float] = {
    ("bridge", 1): 0.12,
    ("bridge", 2): 0.30,
    ("bridge", 3): 0.20,
    ("bridge", 4): 0.13,
    ("comparison", 2): 0.17,
    ("comparison", 4): 0.08,
}

#: Chains through people's spouses and employers are drawn less often than the others.
PATTERN_WEIGHT = {"spouse": 0.35, "employer": 0.6}

#: Words that tell which way a comparison goes: the earlier year, or the later one.
EARLIER_WORDS = ("earlier", "first", "older")
LATER_WORDS = ("later", "more recently", "younger")


@dataclass(frozen=True)
class Comparison:
    """Two entities of `kind`, each followed along `chain`; `mode` is "year" (which has the
    earlier/later year at the end) or "same" (yes/no: do both chains end at one entity)."""

    kind: str
    chain: tuple[str, ...]
    mode: str
    earlier: tuple[str, ...] = ()
    later: tuple[str, ...] = ()
    same: tuple[str, ...] = ()

    @property
    def hops(self) -> int:
        return 2 * len(self.chain)


COMPARISONS: tuple[Comparison, ...] = (
    Comparison("person", ("birth year",), "year",
               ("Who was born earlier, {a} or {b}?", "Who was born first, {a} or {b}?", "Who is older, {a} or {b}?"),
               ("Who was born later, {a} or {b}?", "Who is younger, {a} or {b}?")),
    Comparison("company", ("founding year",), "year",
               ("Which company was founded first, {a} or {b}?", "Which company is older, {a} or {b}?"),
               ("Which company was founded more recently, {a} or {b}?", "Which company was founded later, {a} or {b}?")),
    Comparison("university", ("founding year",), "year",
               ("Which university is older, {a} or {b}?", "Which university was founded first, {a} or {b}?"),
               ("Which university was founded later, {a} or {b}?", "Which university was founded more recently, {a} or {b}?")),
    Comparison("film", ("release year",), "year",
               ("Which film came out first, {a} or {b}?", "Which film was released earlier, {a} or {b}?"),
               ("Which film was released more recently, {a} or {b}?", "Which film came out later, {a} or {b}?")),
    Comparison("book", ("publication year",), "year",
               ("Which novel was published first, {a} or {b}?", "Which book came out earlier, {a} or {b}?"),
               ("Which novel was published more recently, {a} or {b}?", "Which book was published later, {a} or {b}?")),
    Comparison("band", ("founding year",), "year",
               ("Which band was formed first, {a} or {b}?", "Which band formed earlier, {a} or {b}?"),
               ("Which band was formed more recently, {a} or {b}?", "Which band formed later, {a} or {b}?")),
    Comparison("person", ("born in",), "same",
               same=("Were {a} and {b} born in the same city?", "Do {a} and {b} have the same birthplace?")),
    Comparison("film", ("directed by",), "same",
               same=("Were {a} and {b} directed by the same person?", "Do {a} and {b} have the same director?")),
    Comparison("book", ("written by",), "same",
               same=("Were {a} and {b} written by the same author?", "Do {a} and {b} have the same author?")),
    Comparison("city", ("country",), "same",
               same=("Are {a} and {b} in the same country?", "Are {a} and {b} located in the same country?")),
    Comparison("film", ("directed by", "birth year"), "year",
               ("Which film has the director who was born earlier, {a} or {b}?", "Whose director was born first, {a} or {b}?"),
               ("Which film has the younger director, {a} or {b}?", "Which film's director was born later, {a} or {b}?")),
    Comparison("book", ("written by", "birth year"), "year",
               ("Which novel's author was born first, {a} or {b}?", "Which book has the older author, {a} or {b}?"),
               ("Which novel has the younger author, {a} or {b}?", "Which book's author was born later, {a} or {b}?")),
    Comparison("company", ("founded by", "birth year"), "year",
               ("Which company's founder was born earlier, {a} or {b}?", "Which company has the older founder, {a} or {b}?"),
               ("Which company has the younger founder, {a} or {b}?", "Which company's founder was born later, {a} or {b}?")),
    Comparison("person", ("born in", "country"), "same",
               same=("Are {a} and {b} from the same country?", "Were {a} and {b} born in the same country?")),
    Comparison("company", ("headquartered in", "country"), "same",
               same=("Are {a} and {b} headquartered in the same country?", "Are {a} and {b} based in the same country?")),
    Comparison("university", ("located in", "country"), "same",
               same=("Are {a} and {b} in the same country?", "Are {a} and {b} located in the same country?")),
)


def bridge_patterns(max_hops: int = 4) -> dict[int, list[tuple[Relation, ...]]]:
    """Every chain of relations of 1 to `max_hops` hops, by length, in a fixed order.

    A chain never repeats a relation, never continues past a year, and never asks for the
    country of a capital (that leads back to where it started)."""
    kinds = list(dict.fromkeys(r.subject for r in RELATIONS.values()))
    out: dict[int, list[tuple[Relation, ...]]] = {h: [] for h in range(1, max_hops + 1)}

    def grow(chain: tuple[Relation, ...]) -> None:
        out[len(chain)].append(chain)
        if len(chain) == max_hops or chain[-1].object == YEAR:
            return
        for r in RELATIONS.values():
            if r.subject != chain[-1].object or any(r.name == c.name for c in chain):
                continue
            if chain[-1].name == "capital" and r.name == "country":
                continue
            grow(chain + (r,))

    for kind in kinds:
        for r in RELATIONS.values():
            if r.subject == kind:
                grow((r,))
    return out


def render_bridge(chain: tuple[Relation, ...], start: str, rng: random.Random) -> str:
    """The question asking for the end of `chain` from the entity called `start`."""
    last = len(chain) - 1
    if len(chain) >= 2 and chain[-1].name == "country" and chain[-2].name in COUNTRY_MERGES:
        inner = _noun_phrase(chain[:-2], start, rng)
        q = _pick(COUNTRY_MERGES[chain[-2].name][0], len(chain) > 2, rng).format(s=inner)
    else:
        inner = _noun_phrase(chain[:last], start, rng)
        q = _pick(chain[-1].questions, last > 0, rng).format(s=inner)
    return q[0].upper() + q[1:]


def _pick(templates: tuple[str, ...], nested: bool, rng: random.Random) -> str:
    """Any template around a plain name; the first (the one that reads well) around a phrase."""
    return templates[0] if nested else rng.choice(templates)


def _noun_phrase(chain: tuple[Relation, ...], start: str, rng: random.Random) -> str:
    """A noun phrase for the entity at the end of `chain` ("the director of X")."""
    s, i = start, 0
    while i < len(chain):
        r = chain[i]
        if i + 1 < len(chain) and chain[i + 1].name == "country" and r.name in COUNTRY_MERGES:
            s = _pick(COUNTRY_MERGES[r.name][1], i > 0, rng).format(s=s)
            i += 2
        else:
            s = _pick(r.phrases, i > 0, rng).format(s=s)
            i += 1
    return s


class QuestionMaker:
    """Draws questions per split from disjoint pools of named entities, without repeats."""

    def __init__(self, kb: KnowledgeBase, corpus: list[Passage], fact_passage: dict[tuple[int, str], int],
                 rng: random.Random, sizes: dict[str, int]) -> None:
        self.kb, self.corpus, self.fact_passage, self.rng = kb, corpus, fact_passage, rng
        self.patterns = bridge_patterns()
        self.weights = {h: [_weight(c) for c in cs] for h, cs in self.patterns.items()}
        self.sizes = sizes
        # every entity can be named only by the questions of one split
        total = sum(sizes.values()) or 1
        bounds, acc = [], 0.0
        for name, n in sizes.items():
            acc += n / total
            bounds.append((acc, name))
        self.pools: dict[str, dict[str, list[int]]] = {name: {} for name in sizes}
        for kind, ids in kb.by_kind.items():
            for i in ids:
                x = rng.random()
                split = next((name for b, name in bounds if x < b), bounds[-1][1])
                self.pools[split].setdefault(kind, []).append(i)
        self.seen_signatures: set[tuple] = set()  # membership only
        self.seen_questions: set[str] = set()  # membership only
        self._groups: dict[tuple[str, int], dict[object, list[int]]] = {}

    # -- following chains ----------------------------------------------------------------------
    def follow(self, start: int, chain: tuple[Relation, ...]) -> list[int] | None:
        """The values along `chain` from `start` (entity indices, a year last), or None if a
        fact is missing or the chain comes back to an entity it has visited."""
        values, cur = [start], start
        for r in chain:
            v = self.kb[cur].facts.get(r.name)
            if v is None:
                return None
            if r.object != YEAR:
                if v in values:
                    return None
                cur = v
            values.append(v)
        return values

    def _evidence(self, start: int, chain: tuple[Relation, ...], values: list[int]):
        triples, subs = [], []
        for r, s, o in zip(chain, values, values[1:]):
            subj, obj = self.kb[s].name, object_name(self.kb, r, o)
            pid = self.corpus[self.fact_passage[(s, r.name)]].id
            triples.append((subj, r.name, obj))
            subs.append(SubQuestion(question=self.rng.choice(r.questions).format(s=subj), answer=obj, paragraph_ids=(pid,)))
        return triples, subs

    @staticmethod
    def _gold(triples: list[tuple[str, str, str]], subs: list[SubQuestion]) -> GoldEvidence:
        titles = tuple(dict.fromkeys(t[0] for t in triples))
        pids = tuple(dict.fromkeys(p for s in subs for p in s.paragraph_ids))
        return GoldEvidence(titles=titles, paragraph_ids=pids, triples=tuple(triples), sub_questions=tuple(subs))

    def _phrase(self, i: int) -> str:
        e = self.kb[i]
        if e.kind in KIND_NOUN and self.rng.random() < 0.3:
            return f"{KIND_NOUN[e.kind]} {e.name}"
        return e.name

    def _admissible(self, question: str, hidden: list[str], signature: tuple) -> bool:
        """No hidden name (intermediate entity, answer) in the question, no repeat."""
        low = question.lower()
        if signature in self.seen_signatures or question in self.seen_questions:
            return False
        return not any(h.lower() in low for h in hidden)

    def _accept(self, question: str, signature: tuple) -> None:
        self.seen_signatures.add(signature)
        self.seen_questions.add(question)

    # -- bridge ----------------------------------------------------------------------------------
    def bridge(self, split: str, hops: int) -> QAItem | None:
        rng, pool = self.rng, self.pools[split]
        chain = rng.choices(self.patterns[hops], self.weights[hops])[0]
        starts = pool.get(chain[0].subject)
        if not starts:
            return None
        start = rng.choice(starts)
        values = self.follow(start, chain)
        if values is None:
            return None
        question = render_bridge(chain, self._phrase(start), rng)
        triples, subs = self._evidence(start, chain, values)
        end = values[-1]
        answers = (str(end),) if chain[-1].object == YEAR else self.kb.alias(end)
        hidden = [t[2] for t in triples] + list(answers)
        signature = ("bridge", start, tuple(r.name for r in chain))
        if not self._admissible(question, hidden, signature):
            return None
        self._accept(question, signature)
        return QAItem(id="", question=question, answers=answers, dataset="world", split=split, type="bridge",
                      hops=hops, evidence=self._gold(triples, subs))

    # -- comparison ------------------------------------------------------------------------------
    def _chain(self, spec: Comparison) -> tuple[Relation, ...]:
        kinds, out = [spec.kind], []
        for name in spec.chain:
            r = RELATIONS[(kinds[-1], name)]
            out.append(r)
            kinds.append(r.object)
        return tuple(out)

    def _group(self, split: str, spec_index: int, chain: tuple[Relation, ...]) -> dict[object, list[int]]:
        """Named entities of the split by the end of their chain (for pairs that agree)."""
        key = (split, spec_index)
        if key not in self._groups:
            groups: dict[object, list[int]] = {}
            for i in self.pools[split].get(chain[0].subject, []):
                values = self.follow(i, chain)
                if values is not None:
                    groups.setdefault(values[-1], []).append(i)
            self._groups[key] = groups
        return self._groups[key]

    def comparison(self, split: str, hops: int) -> QAItem | None:
        rng = self.rng
        specs = [(k, c) for k, c in enumerate(COMPARISONS) if c.hops == hops]
        k, spec = rng.choice(specs)
        chain = self._chain(spec)
        pool = self.pools[split].get(spec.kind, [])
        if len(pool) < 2:
            return None
        a = rng.choice(pool)
        va = self.follow(a, chain)
        if va is None:
            return None
        want_same = spec.mode == "same" and rng.random() < 0.5
        if want_same:
            mates = [i for i in self._group(split, k, chain).get(va[-1], []) if i != a]
            if not mates:
                return None
            b = rng.choice(mates)
        else:
            b = rng.choice(pool)
        vb = self.follow(b, chain)
        if b == a or vb is None or (not want_same and va[-1] == vb[-1]) or (want_same and va[-1] != vb[-1]):
            return None
        if rng.random() < 0.5:
            a, b, va, vb = b, a, vb, va
        if spec.mode == "same":
            template, answer = rng.choice(spec.same), "yes" if va[-1] == vb[-1] else "no"
        else:
            earlier = rng.random() < 0.5
            template = rng.choice(spec.earlier if earlier else spec.later)
            first = a if va[-1] < vb[-1] else b
            second = b if first == a else a
            answer = self.kb[first if earlier else second].name
        question = template.format(a=self._phrase(a), b=self._phrase(b))
        ta, sa = self._evidence(a, chain, va)
        tb, sb = self._evidence(b, chain, vb)
        hidden = [t[2] for t in ta + tb]
        signature = ("comparison", k, min(a, b), max(a, b))
        if not self._admissible(question, hidden, signature):
            return None
        self._accept(question, signature)
        return QAItem(id="", question=question, answers=(answer,), dataset="world", split=split, type="comparison",
                      hops=hops, evidence=self._gold(ta + tb, sa + sb))

    # -- splits ----------------------------------------------------------------------------------
    def make_split(self, split: str) -> list[QAItem]:
        n = self.sizes[split]
        quota = _apportion(n, CATEGORIES)
        items: list[QAItem] = []
        for (qtype, hops), want in quota.items():
            make = self.bridge if qtype == "bridge" else self.comparison
            got, tries = 0, 0
            while got < want and tries < 400 * want:
                tries += 1
                item = make(split, hops)
                if item is not None:
                    items.append(item)
                    got += 1
            if got < want:
                log.warning("world: %s split has %d of %d %s %d-hop questions", split, got, want, qtype, hops)
        self.rng.shuffle(items)
        return [_with_id(it, f"world-{split}-{i:05d}") for i, it in enumerate(items)]


def _weight(chain: tuple[Relation, ...]) -> float:
    w = 1.0
    for r in chain:
        w *= PATTERN_WEIGHT.get(r.name, 1.0)
    return w


def _with_id(item: QAItem, new_id: str) -> QAItem:
    return replace(item, id=new_id)


def _apportion(n: int, shares: dict[tuple[str, int], float]) -> dict[tuple[str, int], int]:
    """Split n by shares, rounding by largest remainder (sums to n, order of `shares` kept)."""
    raw = {k: n * v / sum(shares.values()) for k, v in shares.items()}
    out = {k: int(v) for k, v in raw.items()}
    rest = sorted(raw, key=lambda k: (-(raw[k] - out[k]), list(shares).index(k)))
    for k in rest[: n - sum(out.values())]:
        out[k] += 1
    return out
