"""The HTML report: records read back (bad ones noted, never fatal), the methods' explanations, escaping,
and the page itself in headless Chromium (a real click into a question; screenshot in the test artifacts)."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest

from knowtrace_train.kg import Triplet
from knowtrace_train.methods import get_method
from knowtrace_train.report_html import collect, embed_json, write_report
from knowtrace_train.trajectory import ModelCall, Trajectory

from backtrace_fixtures import T_EDUCATED, T_INDUSTRIALIST, T_WROTE, appendix_f, random_trajectory

REPO = Path(__file__).resolve().parents[1]
WORLD_DEV_0 = json.loads((REPO / "data/world/dev.jsonl").read_text(encoding="utf-8").split("\n", 1)[0])
XSS = "</script><img src=x onerror=\"window.__pwned=1\"><script>window.__pwned=2</script>"


def _iv(m: float, n: int, lo: float | None, hi: float | None) -> dict:
    return {"mean": m, "low": lo, "high": hi, "n": n, "confidence": 0.95,
            "note": None if lo is not None else "n < 20: too few questions for an interval"}


def _metrics(it, em: float, n: int = 24, fa: float | None = None) -> dict:
    m = {"iteration": it, "model": str(it), "eval": {"questions": n, "em": em, "f1": em + 0.1,
                                                      "em_interval": _iv(em, n, em - 0.1, em + 0.1),
                                                      "f1_interval": _iv(em + 0.1, n, em, em + 0.2)},
         "seconds": {"eval": 2.0}}
    if isinstance(it, int) and it > 0:
        m.update(status="trained", rollout={"questions": 6, "correct": 3, "em": 0.5},
                 rationale={"fa_ratio": fa, "fa_by_role": {"explore": 0.4, "complete": 0.2, "answer": 0.0}},
                 sft_records={"explore": 5, "complete": 6, "answer": 0},
                 vs_m0={"em": {"diff": em - 0.25, "p_value": 0.5}}, seconds={"rollout": 3.0, "train": 4.0, "eval": 2.0})
    return m


def no_graph_trajectory() -> Trajectory:
    """A chain-style method's trajectory with calls but no graph, from a method this checkout does not register."""
    calls = [ModelCall(0, "chain", 1, "prompt", "a reasoning chain", 3, 4, parsed=None),
             ModelCall(1, "answer", 2, "prompt", "Answer: Paris", 3, 2, parsed={"answer": "Paris"})]
    return Trajectory(id="chain-1", question_id="chain-1", question="What is the capital of France?", answers=["Paris"],
                      dataset="hotpotqa", strategy="unregistered_chain", calls=calls, prediction="Paris", em=1.0, f1=1.0)


def xss_trajectory() -> Trajectory:
    t = appendix_f()
    t.id = t.question_id = "xss-1"
    t.question = "Is this " + XSS
    t.calls[0].output = XSS
    t.graph.add(__import__("knowtrace_train.kg", fromlist=["TracedTriplet"]).TracedTriplet(
        Triplet(XSS, "rel " + XSS, "Obj"), 1, None, 1))
    t.prediction = XSS
    t.em = 0.0
    return t


def _write(path: Path, trajs: list[Trajectory], extra_lines: list[str] = ()) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(t.to_dict()) for t in trajs] + list(extra_lines)
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")


def make_run(root: Path, name: str = "toy_backtrace", mode: str = "backtrace", finished: bool = False) -> Path:
    """A run folder as selftrain writes it: base, M0, iteration 1 done, iteration 2 rolling out
    (only `.parts`), iteration 3 planned and missing; one bad trajectory line."""
    d = root / name
    (d / "base").mkdir(parents=True)
    (d / "config.yaml").write_text(
        f"name: {name}\nmode: {mode}\niterations: 3\ndata:\n  train: data/world/train.jsonl\n  dev: data/world/dev.jsonl\n"
        "  corpus:\n    source: file\n    path: data/world/corpus.jsonl\nstrategy:\n  name: knowtrace\n  path_rule: backward\n",
        encoding="utf-8")
    (d / "base" / "metrics.json").write_text(json.dumps(_metrics("base", 0.05)))
    base = [random_trajectory(s) for s in range(3)]
    base[0].question_id = WORLD_DEV_0["id"]  # its hops and kind come from the run's data files
    _write(d / "base" / "eval.jsonl", base)
    (d / "iter_0").mkdir()
    (d / "iter_0" / "metrics.json").write_text(json.dumps(_metrics(0, 0.25)))
    _write(d / "iter_0" / "eval.jsonl", [appendix_f(), no_graph_trajectory()])
    (d / "iter_1").mkdir()
    (d / "iter_1" / "metrics.json").write_text(json.dumps(_metrics(1, 0.3, fa=0.31 if mode == "backtrace" else 0.0)))
    _write(d / "iter_1" / "rollouts.jsonl", [appendix_f(), xss_trajectory()], ["{not json", '{"id": 3}'])
    odd = random_trajectory(8).to_dict()
    odd["wall_time"] = "slow"  # parses, but no figure can be made of it
    _write(d / "iter_1" / "eval.jsonl", [random_trajectory(7)], [json.dumps(odd)])
    (d / "iter_2" / "rollouts.jsonl.parts").mkdir(parents=True)
    (d / "iter_2" / "DONE.rollout_started").write_text("{}")
    _write(d / "iter_2" / "rollouts.jsonl.parts" / "00000.jsonl", [random_trajectory(9)])
    if finished:
        (d / "summary.json").write_text("{}")
    return d


@pytest.fixture()
def run_dir(tmp_path) -> Path:
    return make_run(tmp_path)


# -- the method's explanation ---------------------------------------------------------------------------


def test_knowtrace_explains_a_trajectory_through_backtracing():
    m = get_method("knowtrace")
    ex = m.explain(appendix_f(), m.config_class())
    assert ex["status"] == "ok" and ex["evidence"] == [0, 3]  # wrote, educated: the paper's Appendix F
    assert "james watt" in ex["target_entities"] and "birmingham" in ex["initial_entities"]
    # the unavailing pair (Birmingham) and the extraneous triplet (industrialist) are what the filters drop
    assert ex["dropped"]["0"] == {"all": False, "items": ["- Birmingham: Find out where Birmingham is located."]}
    assert ex["dropped"]["1"]["items"] == [T_INDUSTRIALIST.render()]
    assert ex["dropped"]["2"]["all"] is True  # the completion that only found where Birmingham is
    json.dumps(ex)


def test_a_method_without_explain_gets_none_and_incorrect_trajectories_drop_nothing():
    from knowtrace_train.methods.base import Method, StrategyConfig

    assert Method().explain(appendix_f(), StrategyConfig()) is None
    t = appendix_f()
    t.em, t.prediction = 0.0, "Oxford"
    ex = get_method("knowtrace").explain(t, get_method("knowtrace").config_class())
    assert ex["dropped"] == {} and ex["note"].startswith("incorrect")


# -- reading records back -------------------------------------------------------------------------------


def test_collect_reads_a_running_run_and_notes_what_is_missing_or_bad(run_dir):
    model = collect([run_dir])
    run = model["runs"][0]
    assert [r["iteration"] for r in run["rows"]] == ["base", 0, 1]
    assert run["rows"][2]["fa_ratio"] == 0.31 and run["rows"][2]["em_text"].startswith("0.300 [0.20,0.40]")
    assert run["series"]["em_x"] == [0, 1] and run["series"]["fa_x"] == [1]
    notes = "\n".join(run["notes"])
    assert "no summary.json" in notes and not run["finished"]
    assert "iteration 2: no metrics.json yet (in progress" in notes
    assert "iteration 3: missing" in notes
    assert "M1 · dev: trajectory 'r8' cannot be shown" in notes
    assert re.search(r"rollouts.jsonl:3: not a trajectory", notes) and "rollouts.jsonl:4" in notes
    labels = [(s["label"], s["n"], s["note"]) for s in run["sets"]]
    assert ("iteration 2 · rollouts (train)", 1, "in progress: 1 trajectories of rollouts.jsonl written so far") in labels
    assert "name: toy_backtrace" in run["config_text"]
    qs = model["questions"]
    assert len(qs) == 3 + 2 + 2 + 1 + 1
    f = next(q for q in qs if q["id"] == "t1" and q["set"] == 1)
    assert f["correct"] and f["explain"]["evidence"] == [0, 3]
    by_i = {e["i"]: e for e in f["graph"]["edges"]}
    assert by_i[0]["evidence"] and by_i[3]["evidence"] and by_i[1]["dropped"] and not by_i[0]["dropped"]
    nodes = {n["key"]: n for n in f["graph"]["nodes"]}
    assert nodes["birmingham"]["initial"] and nodes["university of glasgow"]["target"]
    c0 = f["calls"][0]
    assert [it["dropped"] for it in c0["items"]] == [False, True]
    assert f["calls"][2]["dropped_all"] and not f["calls"][1]["dropped_all"]
    # hop counts come from the run's data files (world questions) where the id is there; the passages
    # of the bundled corpus are looked up by id
    assert [(q["hops"], q["kind"]) for q in qs if q["question_id"] == WORLD_DEV_0["id"]] == [
        (WORLD_DEV_0["hops"], WORLD_DEV_0["type"])]
    chain = next(q for q in qs if q["id"] == "chain-1")
    assert chain["graph"] is None and chain["explain"] is None and "not registered" in chain["explain_note"]
    assert [c["role"] for c in chain["calls"]] == ["chain", "answer"]


def test_a_star_run_says_that_the_struck_items_are_what_backtracing_would_drop(tmp_path):
    qs = collect([make_run(tmp_path, "toy_star", "star")])["questions"]
    assert all("mode is star" in q["explain_note"] for q in qs if q["strategy"] == "knowtrace")


def test_collect_reads_a_bare_trajectory_file_and_a_missing_path(tmp_path):
    f = tmp_path / "eval.jsonl"
    _write(f, [appendix_f(), random_trajectory(1)], ["garbage"])
    model = collect([f, tmp_path / "nowhere"])
    assert [r["kind"] for r in model["runs"]] == ["file", "missing"]
    assert len(model["questions"]) == 2 and any("not a trajectory" in n for n in model["runs"][0]["notes"])
    assert "neither a run folder" in model["runs"][1]["notes"][0]
    # a folder of trajectory files (recipes/evaluate.py's runs/eval/) stands for its files
    _write(tmp_path / "more" / "b.jsonl", [random_trajectory(2)])
    _write(tmp_path / "more" / "a.jsonl", [random_trajectory(3)])
    assert [r["name"] for r in collect([tmp_path / "more"])["runs"]] == ["a.jsonl", "b.jsonl"]


def test_hops_and_passages_come_from_the_data_and_corpus_files(tmp_path):
    dev = [json.loads(line) for line in (REPO / "data/world/dev.jsonl").read_text().splitlines()[:1]]
    corpus = [json.loads(line) for line in (REPO / "data/world/corpus.jsonl").read_text().splitlines()[:2]]
    t = appendix_f()
    t.question_id = dev[0]["id"]
    t.calls[1].passage_ids = [corpus[0]["id"], "unknown-id"]
    f = tmp_path / "e.jsonl"
    _write(f, [t])
    model = collect([f], [REPO / "data/world/dev.jsonl"], REPO / "data/world/corpus.jsonl")
    q = model["questions"][0]
    assert q["hops"] == dev[0]["hops"] and q["kind"] == dev[0]["type"]
    assert model["passages"][corpus[0]["id"]]["title"] == corpus[0]["title"] and "unknown-id" not in model["passages"]


def test_passages_of_a_store_and_of_a_generated_corpus_come_from_the_id_index(tmp_path, monkeypatch):
    """A run that read its corpus as a passage store (store: true, or the source generated) has its passages
    looked up through the store's id index; a generated corpus not in this cache home is never generated."""
    from knowtrace_train.data.generated import open_generated
    from knowtrace_train.report_html.lookups import Lookups

    monkeypatch.setenv("KNOWTRACE_CACHE", str(tmp_path / "cache"))
    world = [json.loads(line) for line in (REPO / "data/world/corpus.jsonl").read_text().splitlines()[:2]]
    wanted = {world[1]["id"], "syn-00000007", "unknown-id"}

    def lookups(corpus: str) -> Lookups:
        run = tmp_path / f"run{len(list(tmp_path.glob('run*')))}"
        run.mkdir()
        (run / "config.yaml").write_text(f"name: r\ndata:\n  corpus: {corpus}\n")
        lk = Lookups()
        lk.add_run_inputs(run)
        return lk

    generated = "{source: generated, path: data/world/corpus.jsonl, passages: 300, seed: 0}"
    lk = lookups(generated)
    assert lk.passages(wanted) == {} and "not in this cache home" in lk.notes[0]
    assert not (tmp_path / "cache").exists()  # nothing generated
    open_generated(300, seed=0)
    found = lookups(generated).passages(wanted)
    assert set(found) == {world[1]["id"], "syn-00000007"} and found[world[1]["id"]]["title"] == world[1]["title"]
    found = lookups("{source: file, path: data/world/corpus.jsonl, store: true}").passages(wanted)
    assert set(found) == {world[1]["id"]} and found[world[1]["id"]]["text"] == world[1]["text"]


def test_model_text_cannot_break_out_of_the_embedded_json(tmp_path, run_dir):
    assert "<" not in embed_json({"x": XSS}) and json.loads(embed_json({"x": XSS + "\u2028"}))["x"] == XSS + "\u2028"
    out = tmp_path / "r.html"
    write_report([run_dir], out)
    html = out.read_text(encoding="utf-8")
    assert html.count("</script>") == 2  # the data block's and the code's: none from the records
    assert "onerror" in html and "<img" not in html  # the text is there, escaped, never markup
    assert "https://" not in html and "http://" not in re.sub(r'createElementNS\("http://www.w3.org/2000/svg"|SVGNS = "http://www.w3.org/2000/svg"', "", html)


def test_the_script_writes_a_report_and_never_dies_on_bad_input(tmp_path, run_dir, capsys):
    import importlib.util

    spec = importlib.util.spec_from_file_location("report_script", REPO / "scripts" / "report.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    assert mod.main([str(run_dir), str(tmp_path / "missing.jsonl"), "--out", str(tmp_path / "r.html")]) == 0
    last = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert last["questions"] == 9 and last["runs"] == 2 and last["notes"] >= 4 and (tmp_path / "r.html").is_file()


# -- the page in a real browser ---------------------------------------------------------------------------


@pytest.fixture(scope="session")
def chromium() -> str:
    from chromium_helpers import find_chromium

    path, why = find_chromium()
    if path is None:
        pytest.skip(f"no headless Chromium: {why}")
    pytest.importorskip("websocket", reason="websocket-client is not installed (pip install -e '.[dev]')")
    return path


@pytest.fixture(scope="session")
def artifacts(tmp_path_factory) -> Path:
    """Where the browser tests leave their screenshots: $KT_TEST_ARTIFACTS (for CI to upload), else pytest's tmp."""
    env = os.environ.get("KT_TEST_ARTIFACTS")
    path = Path(env) if env else tmp_path_factory.mktemp("report-artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture()
def browser(chromium):
    from chromium_helpers import Browser

    b = Browser(chromium)
    yield b
    b.close()


def test_the_page_renders_runs_side_by_side_and_a_clicked_question_with_its_graph(tmp_path, browser, artifacts):
    a = make_run(tmp_path / "a", "toy_backtrace", "backtrace")
    b = make_run(tmp_path / "b", "toy_star", "star", finished=True)
    out = tmp_path / "report.html"
    write_report([a, b], out)
    browser.open(out.as_uri())
    # run view: both runs' tables, the two charts, the notes of the running one
    assert browser.eval("document.querySelectorAll('.run').length") == 2
    assert browser.eval("document.querySelectorAll('table.run-table tbody tr').length") == 6
    assert browser.eval("document.querySelectorAll('.chart svg polyline').length") == 4
    assert "iteration 3: missing" in browser.eval("document.querySelector('.run .notes').textContent")
    browser.screenshot(artifacts / "report_runs.png")
    # a run's trajectory set links to the list filtered to it; the nav link lists everything
    browser.click("a[href='#questions&set=0:2']")  # toy_backtrace, iteration 1 rollouts
    browser.eval("new Promise(r => setTimeout(r, 50))")
    assert browser.eval("document.querySelectorAll('.qrow').length") == 2
    browser.click("header nav a[href='#runs']")
    browser.click("header nav a[href='#questions']")
    browser.eval("new Promise(r => setTimeout(r, 50))")
    assert browser.eval("document.querySelectorAll('.qrow').length") == 2  # the set filter stays until changed
    # the filters: incorrect answers only (the hostile rollout of each run), then one hop count
    def pick(name: str, value: str) -> int:
        browser.eval(f"""(() => {{ const s = document.querySelector('select[data-filter={name}]'); s.value = {json.dumps(value)};
            s.dispatchEvent(new Event('change')); }})()""")
        return browser.eval("document.querySelectorAll('.qrow').length")

    assert pick("set", "") == 18
    assert pick("correct", "false") == 2 and pick("correct", "") == 18
    assert pick("hops", str(WORLD_DEV_0["hops"])) == 2 and pick("hops", "") == 18
    key = browser.eval("""[...document.querySelectorAll('.qrow')].find(r => r.textContent.includes('rioting')
        && r.textContent.includes('rollouts')).dataset.key""")
    browser.click(f".qrow[data-key='{key}']")
    browser.eval("new Promise(r => setTimeout(r, 50))")
    assert browser.eval("location.hash") == f"#q={key}"
    assert browser.eval("document.querySelector('#question-view').dataset.key") == key
    assert browser.eval("document.querySelectorAll('#graph svg g.node').length") == 6  # Appendix F's entities
    assert browser.eval("document.querySelectorAll('#graph svg g.node.initial').length") == 2
    assert browser.eval("document.querySelectorAll('#graph svg g.node.target').length") >= 2
    assert browser.eval("document.querySelectorAll('#graph svg g.edge.evidence').length") == 2
    assert browser.eval("document.querySelectorAll('#graph svg g.edge.dropped').length") == 2
    assert browser.eval("document.querySelectorAll('#triplet-table tr.ev').length") == 2
    struck = browser.eval("[...document.querySelectorAll('.items li.dropped')].map(e => e.textContent)")
    assert "- Birmingham: Find out where Birmingham is located." in struck and T_INDUSTRIALIST.render() in struck
    assert T_WROTE.render() not in struck and T_EDUCATED.render() not in struck
    # the graph is drawn: the SVG has a size and its boxes carry the entities' names
    w = browser.eval("document.querySelector('#graph svg').getBoundingClientRect().width")
    assert w > 300
    assert "James Watt" in browser.eval("document.querySelector('#graph svg').textContent")
    browser.screenshot(artifacts / "report_question.png")
    assert (artifacts / "report_question.png").stat().st_size > 10_000
    assert browser.errors() == []


def test_hostile_model_text_stays_text_and_a_graphless_trajectory_says_so(tmp_path, browser):
    run = make_run(tmp_path, "toy", "backtrace")
    out = tmp_path / "report.html"
    write_report([run], out)
    qs = collect([run])["questions"]
    xss = next(q["key"] for q in qs if q["id"] == "xss-1")
    browser.open(out.as_uri() + f"#q={xss}")
    assert browser.eval("window.__pwned === undefined")
    assert browser.eval("document.querySelectorAll('#app img').length") == 0
    assert XSS in browser.eval("document.querySelector('#question-view .question').textContent")
    assert XSS in browser.eval("document.querySelector('#graph svg').textContent")
    chain = next(q["key"] for q in qs if q["id"] == "chain-1")
    browser.open(out.as_uri() + f"#q={chain}")
    assert browser.eval("document.querySelector('#no-graph') !== null")
    assert browser.eval("document.querySelectorAll('#question-view .call').length") == 2
    assert browser.errors() == []


# -- other methods' trajectories: TRACE's chains are its evidence -------------------------------------------


def trace_trajectory(tmp_path: Path) -> Trajectory:
    """A TRACE-Triple trajectory from the scripted end-to-end run of tests/test_trace.py."""
    from test_trace import run_trace

    (t,) = run_trace(tmp_path / "trace-cache")
    return t


def test_trace_explains_its_chains_as_the_evidence_and_never_raises_on_bad_meta(tmp_path):
    t = trace_trajectory(tmp_path)
    ex = get_method("trace").explain(t, get_method("trace").config_class())
    chained = {i for ch in t.meta["chains"] for i in ch["triplets"]}
    assert ex["status"] == "ok" and set(ex["evidence"]) == chained and ex["dropped"] == {}
    assert ex["initial_entities"] == ["ada lin"] and ex["target_entities"] == ["norway"]
    for bad in ({"chains": "x"}, {"chains": [None, {"triplets": [99, "a", -1]}]}, {}):
        t.meta = bad
        ex = get_method("trace").explain(t, get_method("trace").config_class())
        assert ex["evidence"] == [] and ex["status"] != "ok" and ex["note"]


def test_the_page_draws_a_trace_trajectory_with_its_chains_highlighted(tmp_path, browser, artifacts):
    t = trace_trajectory(tmp_path)
    f = tmp_path / "trace.jsonl"
    _write(f, [t])
    out = tmp_path / "trace.html"
    write_report([f], out)
    (q,) = collect([f])["questions"]
    chained = {i for ch in t.meta["chains"] for i in ch["triplets"]}
    browser.open(out.as_uri() + f"#q={q['key']}")
    assert browser.eval("document.querySelectorAll('#graph svg g.node').length") == len(q["graph"]["nodes"])
    assert browser.eval("document.querySelectorAll('#graph svg g.edge.evidence').length") == len(chained)
    assert browser.eval("document.querySelectorAll('#graph svg g.edge.dropped').length") == len(t.graph.triplets) - len(chained)
    assert browser.eval("document.querySelectorAll('#graph svg g.node.initial').length") == 1
    assert "Norway" in browser.eval("[...document.querySelectorAll('#graph svg g.node.target')].map(n => n.textContent).join()")
    assert browser.eval("document.querySelectorAll('#question-view .call').length") == len(t.calls)
    legend = browser.eval("document.querySelector('#question-view .legend').textContent")
    assert "on no chain" in legend and "filters" not in legend
    assert browser.eval("document.querySelector('#question-view .sub').textContent").startswith("reasoning chains: ok")
    browser.screenshot(artifacts / "report_trace.png")
    assert browser.errors() == []


# -- DoG's walk is its evidence -----------------------------------------------------------------------------


def dog_trajectory() -> Trajectory:
    """The Jaws question of tests/test_dog.py's scripted run: three hops, one filled triple each."""
    from test_dog import JAWS, run

    from knowtrace_train.methods.dog.config import DoGConfig

    (t,), _ = run(DoGConfig(answer_from="tail"), [JAWS])
    return t


def test_dog_explains_its_walk_and_never_raises_on_bad_records():
    t = dog_trajectory()
    ex = get_method("dog").explain(t, get_method("dog").config_class())
    assert ex["status"] == "ok" and ex["evidence"] == [0, 1, 2] and ex["dropped"] == {}
    assert ex["initial_entities"] == ["jaws"] and ex["target_entities"] == ["united states"]
    for c in t.calls:
        c.triplets = [99, -1] if c.role == "relation" else c.triplets
    t.meta = {"topic_entity": 7}
    ex = get_method("dog").explain(t, get_method("dog").config_class())
    assert ex["evidence"] == [] and ex["initial_entities"] == [] and ex["status"] == "no walk" and ex["note"]


def test_the_page_draws_a_dog_walk_from_the_topic_entity_to_the_answer(tmp_path, browser, artifacts):
    t = dog_trajectory()
    f = tmp_path / "dog.jsonl"
    _write(f, [t])
    out = tmp_path / "dog.html"
    write_report([f], out)
    (q,) = collect([f])["questions"]
    browser.open(out.as_uri() + f"#q={q['key']}")
    assert browser.eval("document.querySelectorAll('#graph svg g.edge.evidence').length") == 3
    assert browser.eval("[...document.querySelectorAll('#graph svg g.node.initial')].map(n => n.textContent).join()").startswith("Jaws")
    assert browser.eval("document.querySelectorAll('#graph svg g.node.initial').length") == 1
    assert "United States" in browser.eval("[...document.querySelectorAll('#graph svg g.node.target')].map(n => n.textContent).join()")
    assert browser.eval("document.querySelector('#question-view .sub').textContent").startswith("the walk: ok")
    roles = browser.eval("[...document.querySelectorAll('#question-view .call')].map(c => c.textContent)")
    assert len(roles) == len(t.calls) and any("linguist" in r.lower() for r in roles)
    browser.screenshot(artifacts / "report_dog.png")
    assert browser.errors() == []
