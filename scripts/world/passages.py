"""Passages of the synthetic world: short paragraphs titled by an entity that state its facts in
varied sentences, among distractor sentences (true but off-chain facts, near-miss entities)."""

from __future__ import annotations

import random
from typing import Callable

from knowtrace_train.data.schema import Passage, passage_id

from .kb import SECTORS, Entity, KnowledgeBase

#: A passage stays within this many words and sentences (5 of them go into a small model's prompt).
MAX_WORDS = 78
MAX_SENTENCES = 4

_PRONOUN = {
    "f": ("She", "she", "Her", "her"),
    "m": ("He", "he", "His", "his"),
    "film": ("The film", "the film", "Its", "its"),
    "book": ("The novel", "the novel", "Its", "its"),
    "band": ("The band", "the band", "Its", "its"),
    "company": ("The company", "the company", "Its", "its"),
    "university": ("The university", "the university", "Its", "its"),
    "city": ("The city", "the city", "Its", "its"),
    "country": ("It", "it", "Its", "its"),
}
_FIELDS = ("history", "law", "chemistry", "economics", "architecture", "medicine", "physics", "philosophy", "music", "literature")
_HOBBIES = ("sailing", "chess", "birdwatching", "mountaineering", "old maps", "gardening", "astronomy", "rare books")
_ROLES = ("a retired sailor", "a young teacher", "a disgraced detective", "a travelling musician", "an ageing painter",
          "a young journalist", "a lighthouse keeper", "a stubborn farmer", "a failed inventor", "a night-shift nurse")
_EVENTS = ("returns to the town of her childhood", "searches for a missing brother", "inherits an old hotel",
           "uncovers a smuggling ring", "tries to save a failing theatre", "falls in love during a long winter",
           "sets out on a journey across the mountains", "keeps a secret for forty years")
_INDUSTRY = ("shipbuilding", "textile mills", "wine", "glassworks", "its old cathedral", "its spring fair", "its harbour", "printing")
_RIVER = ("Salt", "Grey", "Long", "Quiet", "Blue", "Amber", "Stone", "Willow")


def _n_sentences(text: str) -> int:
    return text.count(". ") + 1


def _article(word: str) -> str:
    return "an" if word[0] in "aeiou" else "a"


class _Say:
    """Fills sentence templates: the first sentence of a passage names its subject, later
    ones refer to it by pronoun ({S} sentence-initial, {s} inside, {Poss}/{poss} possessive)."""

    def __init__(self, e: Entity) -> None:
        key = e.attrs["gender"] if e.kind == "person" else e.kind
        self.pron = _PRONOUN[key]
        self.name = e.name
        self.named = False

    def __call__(self, template: str, **kw: object) -> str:
        S, s, Poss, poss = self.pron
        if not self.named:
            # the first mention of the subject in the passage is its name, later ones pronouns
            at = [(template.find(k), k) for k in ("{S}", "{s}", "{Poss}", "{poss}") if k in template]
            if at:
                i, k = min(at)
                name = self.name + ("'s" if k in ("{Poss}", "{poss}") else "")
                template = template[:i] + name.replace("{", "{{").replace("}", "}}") + template[i + len(k) :]
                self.named = True
        return template.format(S=S, s=s, Poss=Poss, poss=poss, **kw)


class PassageWriter:
    """Writes every entity's passages and remembers which passage states which fact."""

    def __init__(self, kb: KnowledgeBase, rng: random.Random) -> None:
        self.kb, self.rng = kb, rng
        self.passages: list[Passage] = []
        #: (entity index, relation name) -> index into `passages` of the passage stating it
        self.fact_passage: dict[tuple[int, str], int] = {}
        self._alumni: dict[int, list[int]] = {}
        self._natives: dict[int, list[int]] = {}
        self._based: dict[int, list[int]] = {}
        self._starred: dict[int, list[int]] = {}
        self._campus: dict[int, list[int]] = {}
        for u in kb.by_kind["university"]:
            self._campus.setdefault(kb[u].facts["located in"], []).append(u)
        for p in kb.by_kind["person"]:
            facts = kb[p].facts
            if "educated at" in facts:
                self._alumni.setdefault(facts["educated at"], []).append(p)
            self._natives.setdefault(facts["born in"], []).append(p)
        for c in kb.by_kind["company"]:
            self._based.setdefault(kb[c].facts["headquartered in"], []).append(c)
        for f in kb.by_kind["film"]:
            for a in kb[f].attrs["stars"]:
                self._starred.setdefault(a, []).append(f)

    def write_all(self) -> list[Passage]:
        writers: dict[str, Callable[[Entity], None]] = {
            "country": self._country, "city": self._city, "university": self._university,
            "person": self._person, "company": self._company, "film": self._film,
            "book": self._book, "band": self._band,
        }
        for e in self.kb.entities:
            writers[e.kind](e)
        return self.passages

    # -- helpers -------------------------------------------------------------------------------
    def _emit(self, e: Entity, facts: list[str], stated: tuple[str, ...], extras: list[str]) -> None:
        """One passage: the fact sentences, then distractors while the length budget allows."""
        sentences = list(facts)
        words = sum(len(x.split()) for x in sentences)
        count = sum(_n_sentences(x) for x in sentences)
        for x in extras:
            n = len(x.split())
            if count + _n_sentences(x) > MAX_SENTENCES or words + n > MAX_WORDS:
                break
            sentences.append(x)
            words += n
            count += _n_sentences(x)
        text = " ".join(sentences)
        index = len(self.passages)
        self.passages.append(Passage(id=passage_id(e.name, text), title=e.name, text=text))
        for rel in stated:
            self.fact_passage[(e.index, rel)] = index

    def _name(self, i: int) -> str:
        return self.kb[i].name

    def _other(self, pool: list[int], exclude: int) -> int | None:
        if len(pool) < 2:
            return None
        while True:
            j = self.rng.choice(pool)
            if j != exclude:
                return j

    # -- kinds ---------------------------------------------------------------------------------
    def _country(self, e: Entity) -> None:
        rng, say = self.rng, _Say(e)
        cap = self._name(e.facts["capital"])
        first = rng.choice((
            "{S} is a country whose capital is {cap}.",
            "The capital of {s} is {cap}.",
            "{S}, officially the " + e.attrs["formal"] + " " + e.name + ", is a country with its capital at {cap}.",
            "{S} is a country whose capital and largest city is {cap}.",
        ))
        facts = [say(first, cap=cap)]
        others = [c for c in e.attrs["cities"] if c != e.facts["capital"]]
        extras = [say("{S} has a population of about {m} million.", m=e.attrs["population"])]
        if len(others) >= 2:
            a, b = rng.sample(others, 2)
            extras.append(say("Other major cities include {a} and {b}.", a=self._name(a), b=self._name(b)))
        neighbour = self._other(self.kb.by_kind["country"], e.index)
        if neighbour is not None:
            extras.append(say("{S} borders {k}.", k=self._name(neighbour)))
        rng.shuffle(extras)
        self._emit(e, facts, ("capital",), extras)

    def _city(self, e: Entity) -> None:
        rng, say = self.rng, _Say(e)
        k = self._name(e.facts["country"])
        if "capital_of" in e.attrs:
            first = rng.choice(("{S} is the capital of {k}.", "{S} is the capital and largest city of {k}.",
                                "{S} is the capital city of the country {k}."))
        else:
            first = rng.choice(("{S} is a city in {k}.", "{S} is a town in the country of {k}.", "{S} is a city located in {k}.",
                                "{S} is a port city in {k}.", "{S} lies in the north of {k}.", "{S} is a market town in {k}.",
                                "{S} is a city in the south of the country {k}."))
        facts = [say(first, k=k)]
        extras = [
            say("{S} has a population of about {n:,}.", n=e.attrs["population"]),
            say("{S} lies on the {r} River.", r=rng.choice(_RIVER)),
            say("{S} is known for {x}.", x=rng.choice(_INDUSTRY)),
        ]
        campus = self._campus.get(e.index, [])
        if campus:
            extras.append(say("{S} is home to {u}.", u=self._name(rng.choice(campus))))
        rng.shuffle(extras)
        self._emit(e, facts, ("country",), extras)
        # a second passage: history and notable people (true, off-chain facts)
        say = _Say(e)
        hist = [say(rng.choice(("{S} was first mentioned in records from the {c}th century.",
                                "{S} is one of the oldest towns in the country, first mentioned in the {c}th century.")),
                    c=rng.randint(9, 17))]
        natives = self._natives.get(e.index, [])
        if len(natives) >= 2:
            a, b = rng.sample(natives, 2)
            hist.append(say("Notable people born in {s} include {a} and {b}.", a=self._name(a), b=self._name(b)))
        based = self._based.get(e.index, [])
        if based:
            hist.append(say("The company {c} is headquartered in {s}.", c=self._name(rng.choice(based))))
        hist.append(say("{S} hosts an annual {x} festival.", x=rng.choice(("lantern", "harvest", "music", "film", "boat"))))
        self._emit(e, hist[:1], (), hist[1:])

    def _university(self, e: Entity) -> None:
        rng, say = self.rng, _Say(e)
        c, y = self._name(e.facts["located in"]), e.facts["founding year"]
        form = rng.randrange(3)
        if form == 0:
            facts = [say("Founded in {y}, {s} is a university in {c}.", y=y, c=c)]
        elif form == 1:
            facts = [say(rng.choice(("{S} is a public university in {c}.", "{S} is a university located in {c}.",
                                     "{S} is a private research university based in {c}.")), c=c),
                     say(rng.choice(("{S} was founded in {y}.", "{S} was established in {y}.")), y=y)]
        else:
            facts = [say("{S} was established in {y} in the city of {c}.", y=y, c=c)]
        extras = [say("{S} has about {n:,} students.", n=e.attrs["students"]),
                  say("{S} is known for {x}.", x=e.attrs["known_for"])]
        alumni = self._alumni.get(e.index, [])
        if alumni:
            extras.append(say("{Poss} alumni include {p}.", p=self._name(rng.choice(alumni))))
        rng.shuffle(extras)
        self._emit(e, facts, ("located in", "founding year"), extras)

    def _person(self, e: Entity) -> None:
        rng, kb = self.rng, self.kb
        f = e.facts
        occ = e.attrs["occupation"]
        a = _article(occ)
        city, year = self._name(f["born in"]), f["birth year"]
        # -- life: birth and education
        say = _Say(e)
        form = rng.randrange(5)
        if form == 0:
            facts = [say("{S} (born {y}) is {a} {o} who was born in {c}.", y=year, a=a, o=occ, c=city)]
        elif form == 1:
            facts = [say("{S} is {a} {o} born in {c} in {y}.", y=year, a=a, o=occ, c=city)]
        elif form == 2:
            facts = [say("Born in {c} in {y}, {s} became {a} {o}.", y=year, a=a, o=occ, c=city)]
        elif form == 3:
            facts = [say("{S} is {a} {o}.", a=a, o=occ), say("{S} was born in {y} in the city of {c}.", y=year, c=city)]
        else:
            facts = [say("{S} was born in {y}.", y=year), say("{S} grew up in {c}, where {s} was born, and became {a} {o}.", c=city, a=a, o=occ)]
        stated = ["born in", "birth year"]
        if "educated at" in f:
            u = self._name(f["educated at"])
            facts.append(say(rng.choice(("{S} studied {x} at {u}.", "{S} graduated from {u}.", "{S} attended {u}.",
                                         "{S} earned a degree in {x} at {u}.", "{S} was educated at {u}.")), u=u, x=rng.choice(_FIELDS)))
            stated.append("educated at")
        extras = [say("{S} is known for {poss} interest in {h}.", h=rng.choice(_HOBBIES))]
        if "moved_to" in e.attrs and e.attrs["moved_to"] != f["born in"]:
            extras.append(say(rng.choice(("{S} later moved to {c}.", "{S} has lived in {c} since {y}.")),
                              c=self._name(e.attrs["moved_to"]), y=year + rng.randint(25, 45)))
        rng.shuffle(extras)
        self._emit(e, facts, tuple(stated), extras)
        # -- career and family: employer, spouse, a credit (films, novels, company, band) and a
        # colleague; the passage opens with a fact or, half the time, with the credit
        credit = self._credit(e)
        parts: list[tuple[str, dict, str | None]] = []  # (template, fields, relation stated)
        if "employer" in f:
            parts.append((rng.choice(("{S} joined {c} in {j}.", "{S} worked for {c} for many years.",
                                      "{S} was employed by {c}, which {s} joined in {j}.",
                                      "{S} spent most of {poss} career at {c}.")),
                          dict(c=self._name(f["employer"]), j=e.attrs.get("joined")), "employer"))
        if "spouse" in f:
            parts.append((rng.choice(("{S} is married to {p}.", "{S} married {p} in {y}.", "{Poss} spouse is {p}.",
                                      "{S} and {p} married in {y}.")),
                          dict(p=self._name(f["spouse"]), y=e.attrs["married"]), "spouse"))
        if credit is not None:
            parts.insert(0 if not parts or rng.random() < 0.5 else len(parts), credit)
        if not parts:
            return
        other = self._other(kb.by_kind["person"], e.index)
        if other is not None and other != f.get("spouse"):
            parts.append((rng.choice(("{S} often worked with {p}.", "{S} was a close friend of {p}.")), dict(p=self._name(other)), None))
        say = _Say(e)
        sentences = [say(t, **kw) for t, kw, _ in parts]
        stated = tuple(r for _, _, r in parts if r)
        n_facts = max(i for i, (_, _, r) in enumerate(parts) if r) + 1 if stated else 1
        self._emit(e, sentences[:n_facts], stated, sentences[n_facts:])

    def _credit(self, e: Entity) -> tuple[str, dict, None] | None:
        """A sentence template naming what a person is known for (a true, off-chain fact)."""
        rng, occ, works = self.rng, e.attrs["occupation"], e.attrs.get("works", [])
        if occ == "film director" and works:
            return rng.choice(("{S} directed {w}.", "{S} is best known for directing {w}.")), dict(w=self._name(works[0])), None
        if occ == "novelist" and works:
            return rng.choice(("{S} wrote the novel {w}.", "{S} is the author of {w}.")), dict(w=self._name(works[0])), None
        if occ == "entrepreneur" and "founded" in e.attrs:
            co = self.kb[e.attrs["founded"]]
            return "{S} founded {c} in {y}.", dict(c=co.name, y=co.facts["founding year"]), None
        if occ == "singer" and "band" in e.attrs:
            return "{S} is the lead singer of {b}.", dict(b=self._name(e.attrs["band"])), None
        if occ == "actor" and self._starred.get(e.index):
            return "{S} appeared in {w}.", dict(w=self._name(self._starred[e.index][0])), None
        return None

    def _company(self, e: Entity) -> None:
        rng, say = self.rng, _Say(e)
        sector = SECTORS[e.attrs["sector"]][1]
        fo, y, hq = self._name(e.facts["founded by"]), e.facts["founding year"], self._name(e.facts["headquartered in"])
        a = _article(sector)
        form = rng.randrange(4)
        if form == 0:
            facts = [say("{S} is {a} {x} company founded by {f} in {y}.", a=a, x=sector, f=fo, y=y),
                     say(rng.choice(("{S} is headquartered in {c}.", "{S} is based in {c}.", "{Poss} headquarters are in {c}.")), c=hq)]
        elif form == 1:
            facts = [say("{S} is {a} {x} company headquartered in {c}.", a=a, x=sector, c=hq),
                     say(rng.choice(("{S} was founded in {y} by {f}.", "{S} was established by {f} in {y}.")), f=fo, y=y)]
        elif form == 2:
            facts = [say("{f} founded {s} in {y}.", f=fo, y=y),
                     say("{S} is {a} {x} company based in {c}.", a=a, x=sector, c=hq)]
        else:
            facts = [say("{S}, {a} {x} company based in {c}, was founded in {y}.", a=a, x=sector, c=hq, y=y),
                     say("{S} was founded by {f}.", f=fo)]
        extras = [say("{S} employs about {n:,} people.", n=e.attrs["staff"])]
        far = rng.choice(self.kb.by_kind["city"])
        if far != e.facts["headquartered in"]:
            extras.append(say("In {y}, {s} opened an office in {c}.", y=min(2024, y + rng.randint(5, 40)), c=self._name(far)))
        rng.shuffle(extras)
        self._emit(e, facts, ("founded by", "founding year", "headquartered in"), extras)

    def _film(self, e: Entity) -> None:
        rng, say = self.rng, _Say(e)
        d, y, g = self._name(e.facts["directed by"]), e.facts["release year"], e.attrs["genre"]
        form = rng.randrange(4)
        if form == 0:
            facts = [say("{S} is a {y} {g} film directed by {d}.", y=y, g=g, d=d)]
        elif form == 1:
            facts = [say("{S} is {a} {g} film directed by {d}.", a=_article(g), g=g, d=d),
                     say(rng.choice(("{S} was released in {y}.", "{S} premiered in {y}.", "{S} came out in {y}.")), y=y)]
        elif form == 2:
            facts = [say("{S} is {a} {g} film released in {y}.", a=_article(g), g=g, y=y),
                     say(rng.choice(("{S} was directed by {d}.", "{d} directed {s}.", "{Poss} director is {d}.")), d=d)]
        else:
            facts = [say("{S} was directed by {d} and released in {y}.", d=d, y=y)]
        stated = ["directed by", "release year"]
        if "produced by" in e.facts:
            facts.append(say(rng.choice(("{S} was produced by {p}.", "{p} produced {s}.", "{Poss} production company is {p}.")),
                             p=self._name(e.facts["produced by"])))
            stated.append("produced by")
        stars = [self._name(s) for s in e.attrs["stars"]]
        extras = [
            say("{S} stars {a}.", a=" and ".join(stars)),
            say("The story is set in {c}.", c=self._name(e.attrs["setting"])),
            say("{S} follows {r} who {v}.", r=rng.choice(_ROLES), v=rng.choice(_EVENTS)),
        ]
        rng.shuffle(extras)
        self._emit(e, facts, tuple(stated), extras)

    def _book(self, e: Entity) -> None:
        rng, say = self.rng, _Say(e)
        w, y, g = self._name(e.facts["written by"]), e.facts["publication year"], e.attrs["genre"]
        form = rng.randrange(3)
        if form == 0:
            facts = [say("{S} is a {y} {g} novel by {w}.", y=y, g=g, w=w)]
        elif form == 1:
            facts = [say("{S} is {a} {g} novel written by {w}.", a=_article(g), g=g, w=w),
                     say(rng.choice(("{S} was first published in {y}.", "{S} was published in {y}.")), y=y)]
        else:
            facts = [say("{w} wrote {s}, which was first published in {y}.", w=w, y=y)]
        stated = ["written by", "publication year"]
        if "published by" in e.facts:
            facts.append(say(rng.choice(("{S} was published by {p}.", "{p} published {s}.", "{Poss} publisher is {p}.")),
                             p=self._name(e.facts["published by"])))
            stated.append("published by")
        extras = [
            say("The novel is set in {c}.", c=self._name(e.attrs["setting"])),
            say("{S} tells the story of {r} who {v}.", r=rng.choice(_ROLES), v=rng.choice(_EVENTS)),
            say("{S} has been translated into {n} languages.", n=rng.randint(3, 30)),
        ]
        rng.shuffle(extras)
        self._emit(e, facts, tuple(stated), extras)

    def _band(self, e: Entity) -> None:
        rng, say = self.rng, _Say(e)
        c, y, g, s = self._name(e.facts["formed in"]), e.facts["founding year"], e.attrs["genre"], self._name(e.facts["lead singer"])
        form = rng.randrange(3)
        if form == 0:
            facts = [say("{S} is {a} {g} band formed in {c} in {y}.", a=_article(g), g=g, c=c, y=y)]
        elif form == 1:
            facts = [say("{S} is {a} {g} band that was formed in {y} in {c}.", a=_article(g), g=g, c=c, y=y)]
        else:
            facts = [say("{S} is {a} {g} band.", a=_article(g), g=g), say("{S} formed in {c} in {y}.", c=c, y=y)]
        facts.append(say(rng.choice(("{Poss} lead singer is {p}.", "{p} is the lead singer of {s}.", "{S} is fronted by singer {p}.")), p=s))
        far = rng.choice(self.kb.by_kind["city"])
        extras = [say("{S} has released {n} studio albums.", n=e.attrs["albums"]),
                  say("{S} is known for {poss} long live shows.")]
        if far != e.facts["formed in"]:
            extras.append(say("In {y}, {s} toured {c}.", y=min(2024, y + rng.randint(2, 20)), c=self._name(far)))
        rng.shuffle(extras)
        self._emit(e, facts, ("formed in", "founding year", "lead singer"), extras)


def write_passages(kb: KnowledgeBase, rng: random.Random) -> tuple[list[Passage], dict[tuple[int, str], int]]:
    """All passages of the world, and for each (entity index, relation) the passage stating it."""
    w = PassageWriter(kb, rng)
    passages = w.write_all()
    return passages, w.fact_passage
