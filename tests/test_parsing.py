"""The parser on canonical texts (property-based round trip) and on a corpus of messy outputs."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from knowtrace_train.methods.knowtrace import outputs
from knowtrace_train.kg import GuidancePair, Triplet
from knowtrace_train.methods.knowtrace.parsing import is_vague, parse_completion, parse_exploration, parse_kg_text

# -- canonical texts read back exactly --------------------------------------------------

_word = st.text(alphabet="abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789-'.,&éü", min_size=1, max_size=8)
_first = st.sampled_from(list("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyzÉ"))


@st.composite
def names(draw, max_words=5):
    words = draw(st.lists(_word, min_size=0, max_size=max_words - 1))
    name = " ".join([draw(_first) + draw(st.text(alphabet="abcdefghijklmnop", max_size=6))] + words)
    if is_vague(name):
        name = "Q " + name
    return name


@st.composite
def entities(draw):
    """Entity names, sometimes with a colon inside ("Star Wars: Episode IV")."""
    name = draw(names())
    if draw(st.booleans()):
        name = f"{name}: {draw(names(max_words=3))}"
    return name


triplets = st.builds(Triplet, names(), names(), names())
pairs = st.builds(GuidancePair, entities(), names(max_words=8))
sentences = names(max_words=12)


@settings(max_examples=200, deadline=None)
@given(st.lists(triplets, min_size=1, max_size=6, unique_by=lambda t: t.key()))
def test_completion_round_trip(ts):
    r = parse_completion(outputs.completion(ts))
    assert r.triplets == ts and r.error is None and r.rejected == []


@settings(max_examples=200, deadline=None)
@given(st.lists(pairs, min_size=1, max_size=5, unique_by=lambda p: (p.entity.casefold(), p.guidance.casefold())))
def test_exploration_guidance_round_trip(ps):
    r = parse_exploration(outputs.exploration_guidance(ps))
    assert r.sufficient is False and r.pairs == ps and r.error is None and r.answer is None


@settings(max_examples=200, deadline=None)
@given(sentences, names())
def test_exploration_answer_round_trip(thought, answer):
    r = parse_exploration(outputs.exploration_answer(thought, answer))
    assert (r.sufficient, r.thought, r.answer, r.error) == (True, thought, answer, None)
    assert r.answered


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_parsers_never_raise(text):
    e = parse_exploration(text)
    assert e.answered or e.pairs or e.error
    c = parse_completion(text)
    assert c.triplets or c.error or not text.strip()
    assert isinstance(parse_kg_text(text), str)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.sampled_from(["(", ")", ";", "|", ",", ":", "-", "\n", "Answer:", "Thought:", "Yes", "No",
                                 "Retrieval Guidance:", "sufficient:", "*", "1.", " ", "x"]), max_size=60))
def test_parsers_never_raise_on_structure_soup(tokens):
    text = "".join(tokens)
    parse_exploration(text)
    parse_completion(text)


def test_non_string_input_is_an_error_not_a_crash():
    assert parse_exploration(None).error  # type: ignore[arg-type]
    assert parse_completion(None).triplets == []  # type: ignore[arg-type]


# -- completion: messy outputs -----------------------------------------------------------

T = Triplet


@pytest.mark.parametrize(
    "text, expected",
    [
        # every line kept, not only the first (the authors' code kept one)
        ("(A; r; B)\n(C; s; D)\n(E; t; F)", [T("A", "r", "B"), T("C", "s", "D"), T("E", "t", "F")]),
        # numbering and bullets
        ("1. (A; r; B)\n2) (C; s; D)\n- (E; t; F)\n* (G; u; H)\n• (I; v; J)",
         [T("A", "r", "B"), T("C", "s", "D"), T("E", "t", "F"), T("G", "u", "H"), T("I", "v", "J")]),
        # commas (the paper's Appendix F) and trailing separators between triplets
        ("(James Watt, wrote, the rioting being a dividing factor in Birmingham);\n(James Watt, is, an industrialist);",
         [T("James Watt", "wrote", "the rioting being a dividing factor in Birmingham"), T("James Watt", "is", "an industrialist")]),
        # pipes, and a comma inside the object stays there
        ("(A | r | B)\n(Glasgow; is in; Lanarkshire, Scotland)", [T("A", "r", "B"), T("Glasgow", "is in", "Lanarkshire, Scotland")]),
        ("(Paul Klee, was born in, Münchenbuchsee, Switzerland)", [T("Paul Klee", "was born in", "Münchenbuchsee, Switzerland")]),
        # missing parentheses on either side or both
        ("A; r; B\n(C; s; D\nE; t; F)", [T("A", "r", "B"), T("C", "s", "D"), T("E", "t", "F")]),
        # several triplets on one line
        ("(A; r; B), (C; s; D); (E; t; F)", [T("A", "r", "B"), T("C", "s", "D"), T("E", "t", "F")]),
        # nested parentheses in an entity; a parenthesis inside an unparenthesised line
        ("(Blue Harbor (painting); was painted by; Ilsa Marken)\nOdile Farrant; was born in; Castelbrun (France)",
         [T("Blue Harbor (painting)", "was painted by", "Ilsa Marken"), T("Odile Farrant", "was born in", "Castelbrun (France)")]),
        # extra text around the triplets, the header echoed, quotes and markdown
        ("Structured Knowledge Triple(s):\nHere are the triplets:\n(\"A\"; 'r'; **B**)\nI hope this helps!",
         [T("A", "r", "B")]),
        ("Sure. The triplet is (A; r; B) as stated in the document.", [T("A", "r", "B")]),
        # repeated lines are kept once (normalised: case, articles)
        ("(A; r; B)\n(A; r; B)\n(a; R; the B)\n(C; s; D)", [T("A", "r", "B"), T("C", "s", "D")]),
        # more than three fields: the rest belongs to the object
        ("(A; r; B; extra)", [T("A", "r", "B; extra")]),
        # relation and object run together in a two-field triplet: split after the first preposition
        ("(Letters from Solene; was founded in 1969)\n(Odile Farrant | was born in the city of Castelbrun)",
         [T("Letters from Solene", "was founded in", "1969"), T("Odile Farrant", "was born in", "the city of Castelbrun")]),
        ("(S/S; was a South Korean boy group)", [T("S/S", "was", "a South Korean boy group")]),
        # stops at an echoed next prompt section
        ("(A; r; B)\nDocuments:\n(C; s; D)", [T("A", "r", "B")]),
        # Windows line ends, indentation, blank lines
        ("  (A; r; B)\r\n\r\n\t(C; s; D)  ", [T("A", "r", "B"), T("C", "s", "D")]),
    ],
)
def test_completion_messy(text, expected):
    r = parse_completion(text)
    assert r.triplets == expected
    assert r.error is None


@pytest.mark.parametrize(
    "line",
    [
        "(A; r; not found)",
        "(A; r; N/A)",
        "(A; r; none)",
        "(None; r; B)",
        "(A; ; B)",
        "(A; r; Unknown)",
        "(A; r; not mentioned in the documents)",
        "(A; r; No information)",
        "(subject entity; relation; object entity)",
        "(A; r)",
        "(A; was founded in)",
        "(A; the university where he studied)",
        "(A)",
        "The documents do not say.",
    ],
)
def test_completion_rejects_vague_and_incomplete(line):
    r = parse_completion(f"(X; y; Z)\n{line}")
    assert r.triplets == [T("X", "y", "Z")]
    assert r.rejected == [line]


def test_completion_empty_and_garbage():
    assert parse_completion("") == parse_completion("  \n") and parse_completion("").error is None
    r = parse_completion("I could not find anything relevant.")
    assert r.triplets == [] and r.error and r.rejected == ["I could not find anything relevant."]
    r = parse_completion("(A; r; not found)")
    assert r.triplets == [] and r.error


# -- exploration: messy outputs ----------------------------------------------------------

P = GuidancePair
J = outputs.JUDGEMENT


@pytest.mark.parametrize(
    "text, pairs",
    [
        (f"{J} No\nRetrieval Guidance:\n1. A: find x\n2) B: find y", [P("A", "find x"), P("B", "find y")]),
        (f"{J} No\nRetrieval Guidance:\nA: find x\n* **B**: find y", [P("A", "find x"), P("B", "find y")]),
        (f"{J} No Retrieval Guidance: - A: find x", [P("A", "find x")]),
        (f"{J} **No**\n\nRetrieval Guidance:\n\n- A: find x\n- A: find x\n- a: Find X", [P("A", "find x")]),
        # the paper's Appendix F wording
        ("Whether the collected knowledge triplets are sufficient: No\nWhat entity-relation pairs to retrieve in the current step:\n"
         "- The rioting being a dividing factor in Birmingham: Find out who wrote about this topic.\n"
         "- Birmingham: Find out where Birmingham is located.",
         [P("The rioting being a dividing factor in Birmingham", "Find out who wrote about this topic."),
          P("Birmingham", "Find out where Birmingham is located.")]),
        # a colon inside the entity name, a dash separator
        (f"{J} No\nRetrieval Guidance:\n- Star Wars: Episode IV: the director\n- Ada Quist - her birthplace",
         [P("Star Wars: Episode IV", "the director"), P("Ada Quist", "her birthplace")]),
        # no judgement line, but bullet guidance
        ("Retrieval Guidance:\n- A: find x", [P("A", "find x")]),
        ("No\n- A: find x", [P("A", "find x")]),
        # the list ends at the next section
        (f"{J} No\nRetrieval Guidance:\n- A: find x\nQuestion: Who is B?\n- B: nope", [P("A", "find x")]),
        # placeholders and vague parts are dropped
        (f"{J} No\nRetrieval Guidance:\n- Entity name 1: propose guidance\n- A: N/A\n- none: x\n- B: find y", [P("B", "find y")]),
    ],
)
def test_exploration_guidance_messy(text, pairs):
    r = parse_exploration(text)
    assert r.pairs == pairs
    assert r.sufficient is False and r.error is None and not r.answered


@pytest.mark.parametrize(
    "text, thought, answer",
    [
        (f"{J} Yes\nThought: a b.\nAnswer: X", "a b.", "X"),
        (f"{J} yes.\nThought: line one.\nline two.\nAnswer: X\nQuestion: next", "line one. line two.", "X"),
        (f"**{J}** Yes\n**Thought:** t\n**Answer:** \"X\"", "t", "X"),
        (f"{J} Yes\nAnswer: X", None, "X"),
        ("Thought: t\nFinal answer: X", "t", "X"),
        (f"{J} Yes\nThought: t\nAnswer: X\nAnswer: Y", "t", "X"),
        # the answer on the thought's line, or right after the forced "Thought:"
        (f"{J} Yes\nThought: t. Answer: X", "t.", "X"),
        (f"{J} Yes\nThought: the answer: maybe. Answer: X", "the answer: maybe.", "X"),
        (f"{J} Yes\nThought: Answer: X", None, "X"),
    ],
)
def test_exploration_answer_messy(text, thought, answer):
    r = parse_exploration(text)
    assert (r.sufficient, r.thought, r.answer, r.error) == (True, thought, answer, None)


@pytest.mark.parametrize(
    "text, error",
    [
        ("", "empty output"),
        ("lorem ipsum dolor", "no judgement"),
        (f"{J} Yes or No", "no judgement"),
        (f"{J} Yes\nThought: I am not sure.", "without an answer"),
        (f"{J} Yes\nAnswer: ", "without an answer"),
        (f"{J} No\nRetrieval Guidance:\n- Entity name 1: propose a guidance", "without any usable guidance"),
        (f"{J} No\nI need more information.", "without any usable guidance"),
        (f"{J} Yes\n- A: find x", "without an answer"),
    ],
)
def test_exploration_unusable_outputs_are_recorded(text, error):
    r = parse_exploration(text)
    assert r.error and error in r.error
    assert not r.answered
    d = r.to_dict()
    assert d["error"] == r.error and isinstance(d["pairs"], list)


def test_kg_text():
    assert parse_kg_text(" A was born in B.\nB is a town.\n\nKnowledge triplets:\n(x; y; z)") == "A was born in B. B is a town."
    assert parse_kg_text("") == ""


def test_an_output_cut_at_the_token_limit_loses_its_unfinished_last_line():
    text = "(A; r; B)\n(C; s; D)\n(E; born in; 19"
    assert parse_completion(text).triplets[-1] == T("E", "born in", "19")  # a missing ")" is tolerated...
    assert parse_completion(text, cut=True).triplets == [T("A", "r", "B"), T("C", "s", "D")]  # ...unless cut
    assert parse_completion("(A; r; B)\n(C; s; D)", cut=True).triplets == [T("A", "r", "B"), T("C", "s", "D")]
    assert parse_completion("(A; r; B", cut=True).triplets == [T("A", "r", "B")]  # the only line is kept
    g = f"{J} No\nRetrieval Guidance:\n- A: find x\n- B: the founder of Haeline Na"
    assert parse_exploration(g, cut=True).pairs == [P("A", "find x")]
    assert len(parse_exploration(g).pairs) == 2
    assert parse_exploration(f"{J} Yes\nThought: t\nAnswer: Corla", cut=True).answer == "Corla"
