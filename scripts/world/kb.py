"""The knowledge base of the synthetic world: entities of several kinds, their facts and their names (over 500 lines: one generator whose seeded draws must stay in order, or the committed world changes)."""

from __future__ import annotations

import bisect
import random
from dataclasses import dataclass
from typing import Any

from .names import NameCoiner, contains_shorter, nested_names

YEAR = "year"


@dataclass(frozen=True)
class Relation:
    """A functional relation: each subject has at most one object.

    `name` is the canonical relation written in gold triples; `questions` ask for the object
    of the subject (`{s}`); `phrases` name the object as a noun phrase built on the subject's
    phrase (empty for years, which are never the subject of another hop). The first question
    and the first phrase read well around a long nested subject ("the employer of the spouse
    of X"); the others are used only when the subject is a plain name.
    """

    name: str
    subject: str
    object: str
    questions: tuple[str, ...]
    phrases: tuple[str, ...] = ()


#: Relations keyed by (subject kind, canonical name).
RELATIONS: dict[tuple[str, str], Relation] = {
    (r.subject, r.name): r
    for r in (
        Relation(
            "born in", "person", "city",
            ("Where was {s} born?", "In which city was {s} born?", "What is the birthplace of {s}?"),
            ("the city where {s} was born", "the birthplace of {s}"),
        ),
        Relation(
            "birth year", "person", YEAR,
            ("In what year was {s} born?", "When was {s} born?", "What is the birth year of {s}?"),
        ),
        Relation(
            "educated at", "person", "university",
            ("Which university did {s} attend?", "At which university did {s} study?", "Where was {s} educated?"),
            ("the university where {s} studied", "the university {s} attended"),
        ),
        Relation(
            "employer", "person", "company",
            ("Which company employed {s}?", "Which company did {s} work for?", "Who was the employer of {s}?"),
            ("the employer of {s}", "the company {s} worked for"),
        ),
        Relation(
            "spouse", "person", "person",
            ("Who is the spouse of {s}?", "Who is {s} married to?", "Whom did {s} marry?"),
            ("the spouse of {s}",),
        ),
        Relation(
            "country", "city", "country",
            ("In which country is {s}?", "Which country is {s} located in?", "In what country is {s}?"),
            ("the country where {s} is located", "the country {s} is in"),
        ),
        Relation(
            "capital", "country", "city",
            ("What is the capital of {s}?", "Which city is the capital of {s}?"),
            ("the capital of {s}",),
        ),
        Relation(
            "located in", "university", "city",
            ("In which city is {s} located?", "Where is {s} located?", "In which city is {s}?"),
            ("the city where {s} is located", "the city that is home to {s}"),
        ),
        Relation(
            "founded by", "company", "person",
            ("Who founded {s}?", "Who is the founder of {s}?", "Who established {s}?"),
            ("the founder of {s}", "the person who founded {s}"),
        ),
        Relation(
            "headquartered in", "company", "city",
            ("Where is {s} headquartered?", "In which city is {s} headquartered?", "In which city is {s} based?"),
            ("the city where {s} is headquartered", "the city where {s} is based"),
        ),
        Relation(
            "directed by", "film", "person",
            ("Who directed {s}?", "Who is the director of {s}?", "Who was {s} directed by?"),
            ("the director of {s}", "the person who directed {s}"),
        ),
        Relation(
            "release year", "film", YEAR,
            ("In what year was {s} released?", "When was {s} released?", "When did {s} come out?"),
        ),
        Relation(
            "produced by", "film", "company",
            ("Which company produced {s}?", "Who produced {s}?", "What is the production company of {s}?"),
            ("the production company of {s}", "the company that produced {s}"),
        ),
        Relation(
            "written by", "book", "person",
            ("Who wrote {s}?", "Who is the author of {s}?", "Who was {s} written by?"),
            ("the author of {s}", "the person who wrote {s}"),
        ),
        Relation(
            "publication year", "book", YEAR,
            ("In what year was {s} published?", "When was {s} first published?", "When was {s} published?"),
        ),
        Relation(
            "published by", "book", "company",
            ("Which company published {s}?", "Who published {s}?", "Who is the publisher of {s}?"),
            ("the publisher of {s}", "the company that published {s}"),
        ),
        Relation(
            "formed in", "band", "city",
            ("In which city was {s} formed?", "Where was {s} formed?", "Where did {s} form?"),
            ("the city where {s} was formed",),
        ),
        Relation(
            "lead singer", "band", "person",
            ("Who is the lead singer of {s}?", "Who fronts {s}?", "Who is the singer of {s}?"),
            ("the lead singer of {s}", "the singer who fronts {s}"),
        ),
        Relation(
            "founding year", "company", YEAR,
            ("In what year was {s} founded?", "When was {s} founded?", "When was {s} established?"),
        ),
        Relation(
            "founding year", "university", YEAR,
            ("In what year was {s} founded?", "When was {s} founded?", "When was {s} established?"),
        ),
        Relation(
            "founding year", "band", YEAR,
            ("In what year was {s} formed?", "When was {s} formed?", "When did {s} form?"),
        ),
    )
}

#: A location relation followed by "country" reads as one clause ("the country where X was born").
COUNTRY_MERGES: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "born in": (
        ("In which country was {s} born?", "What is the country of birth of {s}?"),
        ("the country where {s} was born",),
    ),
    "headquartered in": (
        ("In which country is {s} headquartered?", "In which country is {s} based?"),
        ("the country where {s} is headquartered",),
    ),
    "located in": (
        ("In which country is {s}?", "In which country is {s} located?"),
        ("the country where {s} is located",),
    ),
    "formed in": (
        ("In which country was {s} formed?", "In what country did {s} form?"),
        ("the country where {s} was formed",),
    ),
}

KIND_NOUN = {"film": "the film", "book": "the novel", "band": "the band", "company": "the company"}

#: Entities per kind at scale 1.0 (the default world); `scale` multiplies them.
BASE_COUNTS = {
    "country": 10,
    "city": 55,
    "university": 40,
    "person": 850,
    "company": 120,
    "film": 260,
    "book": 200,
    "band": 60,
}

#: The fewest entities per kind a world can have (tiny scales still make a world).
MIN_COUNTS = {"country": 3, "city": 8, "university": 4, "person": 60, "company": 12, "film": 12, "book": 10, "band": 4}

SECTORS = {
    # sector: (share, description, name suffixes)
    "film studio": (0.16, "film production", ("Pictures", "Studios", "Films", "Film Company")),
    "publisher": (0.14, "publishing", ("Press", "Books", "Publishing", "House")),
    "engineering": (0.09, "engineering", ("Dynamics", "Engineering", "Works")),
    "automotive": (0.07, "automotive", ("Motors", "Automotive")),
    "food": (0.08, "food processing", ("Foods", "Provisions")),
    "energy": (0.08, "energy", ("Energy", "Power")),
    "software": (0.1, "software", ("Systems", "Software", "Labs")),
    "shipping": (0.07, "shipping", ("Shipping", "Lines", "Freight")),
    "banking": (0.07, "banking", ("Bank", "Capital", "Trust")),
    "pharmaceutical": (0.07, "pharmaceutical", ("Pharmaceuticals", "Health")),
    "textile": (0.07, "textile", ("Textiles", "Mills")),
}

OCCUPATIONS = (
    "architect", "engineer", "physician", "painter", "journalist", "teacher", "chemist",
    "economist", "photographer", "lawyer", "historian", "sculptor", "botanist", "pianist",
    "civil servant", "mathematician", "diplomat", "surgeon", "geologist", "translator",
)

ADJECTIVES = (
    "Silent", "Last", "Hidden", "Broken", "Golden", "Distant", "Crimson", "Quiet", "Burning",
    "Lost", "Northern", "Glass", "Iron", "Paper", "Hollow", "Bright", "Long", "Second", "Wild",
    "Salt", "Winter", "Summer", "Blue", "Pale", "Secret", "Little", "Old", "Empty", "Narrow",
)
NOUNS = (
    "Harbor", "River", "Orchard", "Garden", "Road", "Lantern", "Bridge", "Tower", "Season",
    "Mirror", "Station", "Shore", "Letter", "Crossing", "House", "Valley", "Night", "Promise",
    "Island", "Forest", "Window", "Bell", "Storm", "Field", "Voyage", "Harvest", "Clock", "Door",
)
BAND_NOUNS = ("Foxes", "Lanterns", "Engines", "Ravens", "Tides", "Sparks", "Owls", "Drifters", "Echoes", "Comets")
CITY_SUFFIXES = ("Falls", "Bay", "Springs", "Harbour", "Crossing")
FORMAL = ("Republic of", "Kingdom of", "Federation of", "Grand Duchy of", "Union of")


class Entity:
    """One thing in the world: its kind, name, facts (relation key -> entity index or year)
    and the attributes passages mention (gender, occupation, sector, genre, ...)."""

    __slots__ = ("index", "kind", "name", "facts", "attrs")

    def __init__(self, index: int, kind: str) -> None:
        self.index = index
        self.kind = kind
        self.name = ""
        self.facts: dict[str, int] = {}
        self.attrs: dict[str, Any] = {}

    def __repr__(self) -> str:
        return f"Entity({self.index}, {self.kind}, {self.name!r})"


@dataclass
class KnowledgeBase:
    entities: list[Entity]
    #: entity indices per kind
    by_kind: dict[str, list[int]]
    #: people per role ("film director", "novelist", "entrepreneur", "singer", "actor")
    roles: dict[str, list[int]]

    def __getitem__(self, i: int) -> Entity:
        return self.entities[i]

    def alias(self, i: int) -> tuple[str, ...]:
        """The names an answer naming entity i may take (canonical first)."""
        e = self.entities[i]
        if e.kind == "country":
            return (e.name, f"{e.attrs['formal']} {e.name}")
        return (e.name,)


def object_name(kb: KnowledgeBase, relation: Relation, value: int) -> str:
    """The object of a fact as written in a triple: an entity's name or a year."""
    return str(value) if relation.object == YEAR else kb[value].name


def build_kb(rng: random.Random, scale: float = 1.0) -> KnowledgeBase:
    """Entities, facts and names of a world with `BASE_COUNTS` times `scale` entities."""
    counts = {k: max(MIN_COUNTS[k], round(n * scale)) for k, n in BASE_COUNTS.items()}
    entities: list[Entity] = []
    by_kind: dict[str, list[int]] = {}
    for kind, n in counts.items():
        by_kind[kind] = list(range(len(entities), len(entities) + n))
        entities.extend(Entity(i, kind) for i in by_kind[kind])
    kb = KnowledgeBase(entities, by_kind, {})
    _geography(kb, rng)
    _people(kb, rng)
    _organisations(kb, rng)
    _works(kb, rng)
    _careers(kb, rng)
    _name_all(kb, rng)
    return kb


def _geography(kb: KnowledgeBase, rng: random.Random) -> None:
    countries, cities = kb.by_kind["country"], kb.by_kind["city"]
    # every country gets at least two cities; its first city is its capital
    owners = [countries[i % len(countries)] for i in range(2 * len(countries))]
    owners += [rng.choice(countries) for _ in range(len(cities) - len(owners))]
    for c, k in zip(cities, owners):
        kb[c].facts["country"] = k
        kb[c].attrs["population"] = rng.randint(12, 900) * 1000
        kb[k].attrs.setdefault("cities", []).append(c)
    for k in countries:
        kb[k].facts["capital"] = kb[k].attrs["cities"][0]
        kb[kb[k].facts["capital"]].attrs["capital_of"] = k
        kb[k].attrs["population"] = round(rng.uniform(0.8, 60.0), 1)
        kb[k].attrs["formal"] = rng.choice(FORMAL)
    for u in kb.by_kind["university"]:
        kb[u].facts["located in"] = rng.choice(cities)
        kb[u].facts["founding year"] = rng.randint(1450, 1985)
        kb[u].attrs["students"] = rng.randint(20, 450) * 100
        kb[u].attrs["known_for"] = rng.choice(
            ("medicine", "law", "engineering", "its botanical garden", "its library", "astronomy", "music", "economics")
        )


def _people(kb: KnowledgeBase, rng: random.Random) -> None:
    cities = kb.by_kind["city"]
    for p in kb.by_kind["person"]:
        e = kb[p]
        e.facts["born in"] = rng.choice(cities)
        e.facts["birth year"] = rng.randint(1900, 2000)
        e.attrs["gender"] = rng.choice("fm")
    people = list(kb.by_kind["person"])
    rng.shuffle(people)
    # disjoint roles: the people who direct, write, found companies and sing
    n_dir = max(4, len(kb.by_kind["film"]) * 2 // 5)
    n_auth = max(4, len(kb.by_kind["book"]) * 2 // 3)
    n_found = len(kb.by_kind["company"])
    n_sing = len(kb.by_kind["band"])
    n_act = max(4, len(people) // 10)
    cuts = [0, n_dir, n_dir + n_auth, n_dir + n_auth + n_found, n_dir + n_auth + n_found + n_sing]
    cuts.append(cuts[-1] + n_act)
    if cuts[-1] > len(people):
        raise ValueError(f"scale too small: {len(people)} people for {cuts[-1]} roles")
    roles = ("film director", "novelist", "entrepreneur", "singer", "actor")
    for role, a, b in zip(roles, cuts, cuts[1:]):
        for p in people[a:b]:
            kb[p].attrs["occupation"] = role
    for p in people[cuts[-1] :]:
        kb[p].attrs["occupation"] = rng.choice(OCCUPATIONS)
    for role, a, b in zip(roles, cuts, cuts[1:]):
        kb.roles[role] = people[a:b]


def _organisations(kb: KnowledgeBase, rng: random.Random) -> None:
    cities = kb.by_kind["city"]
    names = list(SECTORS)
    weights = [SECTORS[s][0] for s in names]
    for c, founder in zip(kb.by_kind["company"], kb.roles["entrepreneur"]):
        e = kb[c]
        e.attrs["sector"] = rng.choices(names, weights)[0]
        e.facts["founded by"] = founder
        e.facts["founding year"] = _later(rng, kb[founder].facts["birth year"], 22, 50)
        e.facts["headquartered in"] = rng.choice(cities)
        e.attrs["staff"] = rng.randint(2, 400) * 50
        kb[founder].attrs["founded"] = c
    # at least one studio and one publisher, so films and books can have producers
    companies = kb.by_kind["company"]
    kb[companies[0]].attrs["sector"] = "film studio"
    kb[companies[1]].attrs["sector"] = "publisher"
    for b, singer in zip(kb.by_kind["band"], kb.roles["singer"]):
        e = kb[b]
        e.facts["lead singer"] = singer
        e.facts["formed in"] = rng.choice(cities)
        e.facts["founding year"] = _later(rng, kb[singer].facts["birth year"], 16, 30)
        genres = ("rock", "folk", "jazz", "pop", "indie", "punk", "electronic") if e.facts["founding year"] >= 1975 else ("jazz", "folk", "swing", "blues")
        e.attrs["genre"] = rng.choice(genres)
        e.attrs["albums"] = rng.randint(2, 12)
        kb[singer].attrs["band"] = b


LAST_YEAR = 2024


def _later(rng: random.Random, year: int, lo: int, hi: int) -> int:
    """A year `lo` to `hi` years after `year`, and not after `LAST_YEAR`."""
    hi = max(0, min(hi, LAST_YEAR - year))
    return year + rng.randint(min(lo, hi), hi)


def _by_year(kb: KnowledgeBase, ids: list[int], key: str) -> tuple[list[int], list[int]]:
    order = sorted(ids, key=lambda i: (kb[i].facts[key], i))
    return [kb[i].facts[key] for i in order], order


def _pick_before(rng: random.Random, years: list[int], order: list[int], year: int) -> int | None:
    """A random entity of `order` whose year is at most `year` (None if there is none)."""
    n = bisect.bisect_right(years, year)
    return order[rng.randrange(n)] if n else None


def _works(kb: KnowledgeBase, rng: random.Random) -> None:
    companies = kb.by_kind["company"]
    studios = [c for c in companies if kb[c].attrs["sector"] == "film studio"]
    publishers = [c for c in companies if kb[c].attrs["sector"] == "publisher"]
    s_years, s_order = _by_year(kb, studios, "founding year")
    p_years, p_order = _by_year(kb, publishers, "founding year")
    cities = kb.by_kind["city"]
    actors = kb.roles["actor"]
    for spec in (
        ("film", "film director", "directed by", "release year", "produced by", s_years, s_order),
        ("book", "novelist", "written by", "publication year", "published by", p_years, p_order),
    ):
        kind, creators, by, year_rel, maker_rel, m_years, m_order = spec
        works = kb.by_kind[kind]
        # every creator gets one work; the rest go to creators at random (1-4 works each)
        makers = list(kb.roles[creators])
        assign = makers + [rng.choice(makers) for _ in range(len(works) - len(makers))]
        for w, person in zip(works, assign):
            e = kb[w]
            e.facts[by] = person
            year = _later(rng, kb[person].facts["birth year"], 22, 65)
            e.facts[year_rel] = year
            if rng.random() < 0.85:
                maker = _pick_before(rng, m_years, m_order, year)
                if maker is not None:
                    e.facts[maker_rel] = maker
            e.attrs["setting"] = rng.choice(cities)
            kb[person].attrs.setdefault("works", []).append(w)
            if kind == "film":
                e.attrs["genre"] = rng.choice(("drama", "comedy", "thriller", "war", "crime", "romance", "science fiction", "documentary"))
                e.attrs["stars"] = rng.sample(actors, k=min(len(actors), rng.randint(1, 2)))
            else:
                e.attrs["genre"] = rng.choice(("historical", "crime", "coming-of-age", "science fiction", "satirical", "epistolary", "mystery"))


def _careers(kb: KnowledgeBase, rng: random.Random) -> None:
    u_years, u_order = _by_year(kb, kb.by_kind["university"], "founding year")
    c_years, c_order = _by_year(kb, kb.by_kind["company"], "founding year")
    people = kb.by_kind["person"]
    for p in people:
        e = kb[p]
        born = e.facts["birth year"]
        if rng.random() < 0.8:
            u = _pick_before(rng, u_years, u_order, born + 18)
            if u is not None:
                e.facts["educated at"] = u
        if e.attrs["occupation"] != "entrepreneur" and rng.random() < 0.65:
            c = _pick_before(rng, c_years, c_order, born + 45)
            if c is not None:
                e.facts["employer"] = c
                e.attrs["joined"] = rng.randint(max(born + 20, kb[c].facts["founding year"]), min(2024, born + 60))
        if rng.random() < 0.35:
            e.attrs["moved_to"] = rng.choice(kb.by_kind["city"])
    # spouses: a random 40% of people, paired with the next in birth order
    married = sorted(rng.sample(people, k=(len(people) * 2 // 5) // 2 * 2), key=lambda i: (kb[i].facts["birth year"], i))
    for a, b in zip(married[0::2], married[1::2]):
        kb[a].facts["spouse"] = b
        kb[b].facts["spouse"] = a
        kb[a].attrs["married"] = kb[b].attrs["married"] = min(2024, max(kb[a].facts["birth year"], kb[b].facts["birth year"]) + rng.randint(20, 40))


# -- names --------------------------------------------------------------------------------------


def _name_all(kb: KnowledgeBase, rng: random.Random) -> None:
    coin = NameCoiner(rng)
    namer = _Namer(kb, rng, coin)
    for e in kb.entities:
        e.name = namer.name(e)
    # no name may contain another: rename the containers until none does
    names = [e.name for e in kb.entities]
    bad = nested_names(names)
    if not bad:
        return
    lows = {n.lower(): 0 for n in names}  # membership; keeps old names too (conservative)
    joined = "\n".join(lows)
    lengths = sorted({len(n) for n in lows})
    added: list[str] = []
    for i in bad:
        while True:
            new = namer.name(kb[i])
            low = new.lower()
            inside = low in joined or any(low in a for a in added)
            if not inside and not contains_shorter(low, lows, lengths):
                break
        kb[i].name = new
        lows[low] = 0
        added.append(low)
        if len(low) not in lengths:
            bisect.insort(lengths, len(low))


class _Namer:
    """Names by kind: people share given names and surnames, companies often carry their
    founder's surname, titles share English words: near misses for a lexical retriever."""

    def __init__(self, kb: KnowledgeBase, rng: random.Random, coin: NameCoiner) -> None:
        self.kb, self.rng, self.coin = kb, rng, coin
        n_people = len(kb.by_kind["person"])
        self.given = {g: [coin.word(f"given_{g}") for _ in range(max(8, n_people // 6))] for g in "fm"}
        self.surnames = [coin.word("surname") for _ in range(max(10, n_people * 2 // 5))]
        self.places: list[str] = []
        self.university_words: list[str] = []
        self.used: set[str] = set()  # membership only

    def _place(self, reuse: float) -> str:
        """A coined place word, reused from earlier titles with probability `reuse` (near misses)."""
        if self.places and self.rng.random() < reuse:
            return self.rng.choice(self.places)
        w = self.coin.word("place")
        self.places.append(w)
        return w

    def _title(self, patterns: tuple[str, ...], reuse: float, **words: str) -> str:
        """A title from one of `patterns`; a title that is a bare place word gets a fresh word
        that no other name shares (another title containing it would contain a name)."""
        pattern = self.rng.choice(patterns)
        p = self.coin.word("place") if pattern == "{p}" else self._place(reuse)
        return pattern.format(p=p, **words)

    def name(self, e: Entity) -> str:
        while True:
            n = getattr(self, f"_{e.kind}")(e)
            if n.lower() not in self.used:
                self.used.add(n.lower())
                return n

    def _country(self, e: Entity) -> str:
        return self.coin.word("country")

    def _city(self, e: Entity) -> str:
        w = self.coin.word("city")
        return f"{w} {self.rng.choice(CITY_SUFFIXES)}" if self.rng.random() < 0.12 else w

    def _university(self, e: Entity) -> str:
        rng = self.rng
        if self.university_words and rng.random() < 0.25:
            w = rng.choice(self.university_words)
        else:
            w = self.coin.word("place")
            self.university_words.append(w)
        pattern = rng.choice(("{w} University", "University of {w}", "{w} Institute of Technology", "{w} College", "{w} State University"))
        return pattern.format(w=w)

    def _person(self, e: Entity) -> str:
        return f"{self.rng.choice(self.given[e.attrs['gender']])} {self.rng.choice(self.surnames)}"

    def _company(self, e: Entity) -> str:
        rng = self.rng
        suffix = rng.choice(SECTORS[e.attrs["sector"]][2])
        if rng.random() < 0.35:
            founder = self.kb[e.facts["founded by"]]
            return f"{founder.name.split()[-1]} {suffix}"
        return f"{self._place(0.1)} {suffix}"

    def _film(self, e: Entity) -> str:
        rng = self.rng
        patterns = ("The {a} {n} of {p}", "{p}", "Return to {p}", "{n}s of {p}", "The {p} {n}", "A {n} in {p}",
                    "Last {n} to {p}", "The {p} Affair", "{p} Nights", "{a} {p}")
        return self._title(patterns, 0.3, a=rng.choice(ADJECTIVES), n=rng.choice(NOUNS))

    def _book(self, e: Entity) -> str:
        rng = self.rng
        patterns = ("The {n} of {p}", "{p}'s {n}", "A {a} {n} for {p}", "The {a} {n} at {p}", "Letters from {p}",
                    "The Chronicles of {p}", "{a} Days in {p}", "The {p} {n}")
        return self._title(patterns, 0.3, a=rng.choice(ADJECTIVES), n=rng.choice(NOUNS))

    def _band(self, e: Entity) -> str:
        rng = self.rng
        patterns = ("The {p} {b}", "{p} {b}", "{a} {p}", "The {a} {b} of {p}")
        return self._title(patterns, 0.2, b=rng.choice(BAND_NOUNS), a=rng.choice(ADJECTIVES))


