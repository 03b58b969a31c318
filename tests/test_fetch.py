"""`python -m knowtrace_train.data fetch|list` against local copies of each source (tests/fetch_fixtures.py), no network:
the readers against hand-built items, a resumed download, checksums, offline, a full disk, bad rows, names in configs."""

from __future__ import annotations

import dataclasses
import errno
import json
import subprocess
import sys
from pathlib import Path

import pytest

import fetch_fixtures
from fetch_fixtures import (COMMIT, DPR_ROWS, ED_WOOD, HOTPOT_DEV, MINTQA_POP, MUSIQUE_DEV, WIKI2_ALIASES, WIKI2_DEV, Server, jsonl, point_urls_at,
                            write_parquet, write_sources, zip_of)
from knowtrace_train.data import download as download_mod
from knowtrace_train.data import registry
from knowtrace_train.data.__main__ import main as data_main
from knowtrace_train.data.corpus import read_named_corpus
from knowtrace_train.data.fetch import fetch
from knowtrace_train.data.loaders import load_items, load_items_report
from knowtrace_train.data.registry import FetchError
from knowtrace_train.data.schema import GoldEvidence, Passage, QAItem, SubQuestion, passage_id
from knowtrace_train.io import DataFileError

REPO_ROOT = Path(__file__).resolve().parents[1]


def _p(title: str, text: str) -> Passage:
    return Passage(passage_id(title, text), title, text)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KNOWTRACE_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    return tmp_path / "cache"


@pytest.fixture
def server(tmp_path, monkeypatch, cache):
    s = Server(write_sources(tmp_path / "sources"))
    monkeypatch.setenv("HF_ENDPOINT", s.url)
    point_urls_at(monkeypatch, s.url)
    yield s
    s.close()


def _say(_msg: str) -> None:
    pass


# -- every reader against hand-built items ---------------------------------------------------------------


def expected_hotpot_dev() -> QAItem:
    ed = _p("Ed Wood", "Edward Davis Wood Jr. was an American filmmaker. He was born in 1924.")
    sd = _p("Scott Derrickson", "Scott Derrickson is an American director. He lives in Los Angeles.")
    return QAItem(id="5a8b57f25542995d1e6f1371", question=HOTPOT_DEV["question"], answers=("yes",), dataset="hotpotqa",
                  split="dev", type="comparison", hops=2, context=(ed, sd),
                  evidence=GoldEvidence(titles=("Scott Derrickson", "Ed Wood"), sentences=(("Scott Derrickson", 0), ("Ed Wood", 0)),
                                        paragraph_ids=(sd.id, ed.id)))


def test_hotpotqa_from_the_hub_over_http(server, cache):
    folder, lock = fetch("hotpotqa", log=_say)
    assert folder == cache / "data" / "hotpotqa" / "main" and lock["commit"] == COMMIT and lock["complete"]
    assert load_items("hotpotqa:dev") == [expected_hotpot_dev()]
    train = load_items("hotpotqa:train")
    assert [it.id for it in train] == ["5a7a06935542990198eaf050", "5a879ab05542996e4f30887e"]  # two shards, in order
    assert train[0].context[0].text == "Arthur's Magazine (1844–1846) was an American literary periodical."
    assert [it.split for it in load_items("hotpotqa:dev_fullwiki")] == ["dev_fullwiki"]
    # every file came from the pinned commit, and its SHA-256 (the hub's LFS oid) is in the lock
    assert all(f"/resolve/{COMMIT}/" in p for p, _ in server.requests if "/resolve/" in p)
    assert set(lock["files"]) == {"distractor/train-00000-of-00002.parquet", "distractor/train-00001-of-00002.parquet",
                                  "distractor/validation-00000-of-00001.parquet", "fullwiki/validation-00000-of-00001.parquet"}
    assert not list(folder.rglob("*.part"))


def test_hotpotqa_official_json_gives_the_same_items_as_the_hub(server, cache):
    fetch("hotpotqa", source="url", log=_say)
    assert (cache / "data" / "hotpotqa" / "v1.1" / "hotpot_dev_distractor_v1.json").is_file()
    assert load_items("hotpotqa:dev") == [expected_hotpot_dev()]


def test_2wiki_from_its_zip(server):
    fetch("2wikimultihopqa", log=_say)
    pw = _p("Polish-Russian War (film)", "Polish-Russian War is a 2009 Polish film directed by Xawery Żuławski.")
    xz = _p("Xawery Żuławski", "Xawery Żuławski is a Polish film director. His mother is Małgorzata Braunek.")
    assert load_items("2wikimultihopqa:dev") == [QAItem(  # the answer, then its id's aliases (id_aliases.json)
        id=WIKI2_DEV["_id"], question=WIKI2_DEV["question"], answers=("Małgorzata Braunek", "Malgorzata Braunek"), dataset="2wikimultihopqa",
        split="dev", type="compositional", hops=2, context=(pw, xz),
        evidence=GoldEvidence(titles=("Polish-Russian War (film)", "Xawery Żuławski"),
                              sentences=(("Polish-Russian War (film)", 0), ("Xawery Żuławski", 1)), paragraph_ids=(pw.id, xz.id),
                              triples=(("Polish-Russian War", "director", "Xawery Żuławski"),
                                       ("Xawery Żuławski", "mother", "Małgorzata Braunek"))))]
    assert len(load_items("2wikimultihopqa:train")) == 1


def test_2wiki_is_scored_against_its_aliases_as_its_v1_1_script_scores(server, tmp_path):
    from knowtrace_train.metrics import score

    fetch("2wikimultihopqa", log=_say)
    item = load_items("2wikimultihopqa:dev")[0]
    assert score("Malgorzata Braunek", item.answers, dataset=item.dataset)["em"] == 1.0
    assert score("Malgorzata Braunek", [WIKI2_DEV["answer"]], dataset=item.dataset)["em"] == 0.0  # without the aliases
    # demonyms count as answers too; an id with no line, or a file with no alias file beside it, keeps the answer alone
    rows = [{**WIKI2_DEV, "_id": "a", "answer": "Poland", "answer_id": "Q36"}, {**WIKI2_DEV, "_id": "b", "answer_id": "Q999"}]
    (tmp_path / "w").mkdir()
    (tmp_path / "w" / "dev.json").write_text(json.dumps(rows), encoding="utf-8")
    assert [it.answers for it in load_items(tmp_path / "w" / "dev.json")] == [("Poland",), ("Małgorzata Braunek",)]
    (tmp_path / "w" / "id_aliases.json").write_text(jsonl(WIKI2_ALIASES), encoding="utf-8")
    assert [it.answers for it in load_items(tmp_path / "w" / "dev.json")] == [
        ("Poland", "Republic of Poland", "Polish", "Pole"), ("Małgorzata Braunek",)]
    (tmp_path / "w" / "id_aliases.json").write_text('{"Q_id": "Q36", "aliases": "Poland"}\n', encoding="utf-8")
    with pytest.raises(DataFileError, match=r"id_aliases\.json:1: expected \{Q_id"):
        load_items(tmp_path / "w" / "dev.json")


def test_musique_from_its_zip(server):
    fetch("musique", log=_say)
    pk, sw, vw = (_p(p["title"], p["paragraph_text"]) for p in MUSIQUE_DEV["paragraphs"])
    assert load_items("musique:dev") == [QAItem(
        id="2hop__482757_12019", question=MUSIQUE_DEV["question"], answers=("2000", "two thousand"), dataset="musique",
        split="dev", type="2hop", hops=2, context=(pk, sw, vw),
        evidence=GoldEvidence(titles=("Serena Williams", "Venus Williams"), paragraph_ids=(sw.id, vw.id), sub_questions=(
            SubQuestion("Who is Serena Williams's elder sister?", "Venus Williams", paragraph_ids=(sw.id,)),
            SubQuestion("When did #1 win her first Wimbledon title?", "2000", paragraph_ids=(vw.id,)))))]


def test_mintqa_from_its_release(server):
    fetch("mintqa", log=_say)
    pop, ti = load_items("mintqa:pop"), load_items("mintqa:ti")
    assert pop == [QAItem(
        id="mintqa-0", question=MINTQA_POP[0]["question"], answers=("Mike Budenholzer",), dataset="mintqa", split="pop",
        type="popular-unpopular", hops=2,
        evidence=GoldEvidence(triples=(("Kevin Durant", "member of sports team", "Phoenix Suns"),
                                       ("Phoenix Suns", "head coach", "Mike Budenholzer")),
                              sub_questions=(SubQuestion("Which team does Kevin Durant play for?", "Phoenix Suns", knowledge_type="popular"),
                                             SubQuestion("Who is the head coach of Phoenix Suns?", "Mike Budenholzer",
                                                         knowledge_type="unpopular"))))]
    assert [(it.type, it.hops, it.evidence.sub_questions[0].knowledge_type) for it in ti] == [("new", 1, "new")]


def test_a_mintqa_row_whose_types_do_not_match_its_hops_names_the_field(tmp_path):
    bad = {**MINTQA_POP[0], "type": ["popular"]}
    (tmp_path / "MINTQA-POP.json").write_text(jsonl([MINTQA_POP[0], bad]), encoding="utf-8")
    with pytest.raises(DataFileError, match=r"MINTQA-POP\.json:2: field 'type' must give one knowledge type per hop \(2\)"):
        load_items(tmp_path / "MINTQA-POP.json")
    one = {**MINTQA_POP[0], "type": "popular-unpopular"}  # the labels as one string
    (tmp_path / "MINTQA-POP.json").write_text(jsonl([one]), encoding="utf-8")
    assert load_items(tmp_path / "MINTQA-POP.json")[0].type == "popular-unpopular"


def test_the_corpora(server):
    fetch("wiki2017-abstracts", log=_say)
    fetch("wiki2018-dpr", log=_say)
    abstracts = read_named_corpus("wiki2017-abstracts")
    ed = _p("Ed Wood", "".join(ED_WOOD))
    assert abstracts == [ed, _p("Scott Derrickson", "Scott Derrickson is an American director. He lives in Los Angeles.")]
    assert ed.id in {p.id for p in expected_hotpot_dev().context}  # the open-domain corpus shares the contexts' ids
    assert read_named_corpus("wiki2018-dpr") == [_p(title, text) for _, text, title in DPR_ROWS]


# -- list, names, mirror, offline -------------------------------------------------------------------------


def test_list_and_unknown_names(server, capsys):
    assert data_main(["list"]) == 0
    out = capsys.readouterr().out
    assert "hotpotqa" in out and "not fetched" in out and "mintqa" in out
    assert data_main(["fetch", "hotpotq"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "did you mean 'hotpotqa'" in err and "wiki2018-dpr" in err
    with pytest.raises(FetchError, match=r"musique is not fetched yet .*: run python -m knowtrace_train.data fetch musique"):
        load_items("musique:dev")
    fetch("musique", log=_say)
    with pytest.raises(FetchError, match=r"musique has no split 'test' \(splits: train, dev\)"):
        load_items("musique:test")
    assert data_main(["list"]) == 0 and "musique              qa     fetched" in capsys.readouterr().out


def test_mirror_offline(tmp_path, cache, monkeypatch, capsys):
    mirror = write_sources(tmp_path / "sources") / "files"
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert data_main(["fetch", "musique"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "HF_HUB_OFFLINE is set" in err and "--mirror DIR" in err
    assert data_main(["fetch", "musique", "2wikimultihopqa", "--mirror", str(mirror)]) == 0
    assert "musique:dev: 1 items" in capsys.readouterr().out
    assert load_items("musique:dev")[0].id == "2hop__482757_12019"
    # a hub source from a mirror: the repo's paths under DIR (or DIR/<name>/)
    hub_mirror = tmp_path / "sources" / "hub"
    fetch("hotpotqa", mirror=hub_mirror, log=_say)
    assert load_items("hotpotqa:dev") == [expected_hotpot_dev()]
    assert data_main(["fetch", "musique"]) == 0  # fetched already: offline is fine
    assert "already fetched" in capsys.readouterr().out


# -- downloads: resume, checksum, full disk, half-written files -------------------------------------------


def test_a_killed_download_resumes_with_a_range_request(server, cache, monkeypatch):
    monkeypatch.setattr(download_mod, "CHUNK", 16)
    writes = {"n": 0}
    real = download_mod._append

    def killed(out, chunk):
        writes["n"] += 1
        if writes["n"] > 3:
            raise KeyboardInterrupt
        real(out, chunk)

    monkeypatch.setattr(download_mod, "_append", killed)
    with pytest.raises(KeyboardInterrupt):
        fetch("wiki2018-dpr", log=_say)
    folder = cache / "data" / "wiki2018-dpr" / "dpr-psgs-w100"
    assert (folder / "psgs_w100.tsv.gz.part").stat().st_size == 48
    assert not (folder / "psgs_w100.tsv.gz").exists() and not (folder / registry.LOCK_NAME).exists()
    with pytest.raises(FetchError, match="wiki2018-dpr is not fetched yet"):  # never read half-written
        read_named_corpus("wiki2018-dpr")
    monkeypatch.setattr(download_mod, "_append", real)
    fetch("wiki2018-dpr", log=_say)
    assert server.requests[-1] == ("/files/psgs_w100.tsv.gz", "bytes=48-")
    assert len(read_named_corpus("wiki2018-dpr")) == 2


def _pin(monkeypatch, name: str, sha: str) -> None:
    e = registry.REGISTRY[name]
    s = e.sources[0]
    files = tuple(dataclasses.replace(f, sha256=sha) for f in s.files)
    monkeypatch.setitem(registry.REGISTRY, name, dataclasses.replace(e, sources=(dataclasses.replace(s, files=files),)))


def test_a_wrong_checksum_is_refused_naming_the_file(server, cache, monkeypatch, capsys):
    _pin(monkeypatch, "wiki2018-dpr", "0" * 64)
    assert data_main(["fetch", "wiki2018-dpr"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "psgs_w100.tsv.gz: checksum mismatch" in err and "0" * 64 in err
    folder = cache / "data" / "wiki2018-dpr" / "dpr-psgs-w100"
    assert not list(folder.glob("psgs_w100*")) and not (folder / registry.LOCK_NAME).exists()


def test_the_first_fetch_pins_hashes_that_later_fetches_check(server, cache, tmp_path):
    folder, lock = fetch("musique", log=_say)
    assert set(lock["files"]) == {"musique_v1.0.zip", "musique_ans_v1.0_train.jsonl", "musique_ans_v1.0_dev.jsonl"}
    (folder / "musique_v1.0.zip").unlink()
    (folder / "musique_ans_v1.0_dev.jsonl").unlink()
    zip_of(tmp_path / "sources" / "files" / "musique_v1.0.zip", {"data/musique_ans_v1.0_dev.jsonl": jsonl([MUSIQUE_DEV]) + "\n"})
    with pytest.raises(FetchError, match=r"musique_v1.0.zip: checksum mismatch .*expected " + lock["files"]["musique_v1.0.zip"]["sha256"]):
        fetch("musique", log=_say)


def test_a_full_disk_is_one_line_naming_the_folder_and_the_bytes(server, cache, monkeypatch, capsys):
    def full(out, chunk):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(download_mod, "_append", full)
    assert data_main(["fetch", "wiki2018-dpr"]) == 2
    err = capsys.readouterr().err.strip()
    folder = cache / "data" / "wiki2018-dpr" / "dpr-psgs-w100"
    size = (Path(server.root) / "files" / "psgs_w100.tsv.gz").stat().st_size
    assert len(err.splitlines()) == 1 and f"no space left in {folder}: {size} more bytes needed" in err
    # known sizes are checked before a byte is written
    monkeypatch.setattr(download_mod.shutil, "disk_usage", lambda p: type("U", (), {"free": 10})())
    assert data_main(["fetch", "wiki2018-dpr"]) == 2
    assert f"no space left in {folder}: {size} bytes needed, 10 free" in capsys.readouterr().err


def test_a_bad_row_names_file_row_and_field_or_is_skipped_and_counted(tmp_path, cache, monkeypatch, capsys):
    bad = {k: v for k, v in MUSIQUE_DEV.items() if k != "question"} | {"id": "2hop__bad"}
    mirror = write_sources(tmp_path / "sources", musique_dev=jsonl([MUSIQUE_DEV, bad])) / "files"
    assert data_main(["fetch", "musique", "--mirror", str(mirror)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "musique_ans_v1.0_dev.jsonl:2: missing required field 'question'" in err
    assert data_main(["fetch", "musique", "--mirror", str(mirror), "--skip_bad"]) == 0
    assert "musique:dev: 1 items, 1 bad rows skipped" in capsys.readouterr().out
    assert len(load_items_report("musique:dev", skip_bad=True).skipped) == 1


def test_a_hub_row_with_a_malformed_nested_column_names_row_and_field(tmp_path, cache):
    hub = tmp_path / "hub"
    write_parquet(hub / "distractor/validation-00000-of-00001.parquet", [HOTPOT_DEV])
    write_parquet(hub / "distractor/train-00000-of-00001.parquet", [{**HOTPOT_DEV, "supporting_facts": [["Ed Wood", 0]], "question": ""}])
    write_parquet(hub / "fullwiki/validation-00000-of-00001.parquet", [HOTPOT_DEV])
    fetch("hotpotqa", mirror=hub, log=_say)
    with pytest.raises(Exception, match=r"train-00000-of-00001.parquet: row 0: field 'question' is empty"):
        load_items("hotpotqa:train")


# -- configs that name what was fetched --------------------------------------------------------------------


def test_a_selftrain_config_names_datasets_and_a_corpus(server, cache):
    from knowtrace_train.data.registry import check_data_ref

    with pytest.raises(FetchError, match=r"^data.dev: musique is not fetched yet .*fetch musique$"):
        check_data_ref("musique:dev", "data.dev")
    fetch("musique", log=_say)
    fetch("wiki2018-dpr", log=_say)
    assert check_data_ref("musique:dev", "data.dev") and check_data_ref("wiki2018-dpr", "data.corpus.name", corpus=True)
    assert not check_data_ref("data/world/dev.jsonl", "data.dev")  # a path stays a path
    with pytest.raises(FetchError, match="data.corpus.name: musique is a question set, not a corpus"):
        check_data_ref("musique", "data.corpus.name", corpus=True)


PAPER = ["hotpotqa", "2wiki", "musique"]


@pytest.mark.parametrize("name", PAPER)
def test_the_paper_configs_load(name):
    from knowtrace_train.config import load_config
    from knowtrace_train.selftrain.config import SelfTrainConfig

    gpu = load_config(SelfTrainConfig, REPO_ROOT / "recipes" / "configs" / f"selftrain_paper_{name}.yaml")
    assert gpu.data.train_questions == 5000 and gpu.data.dev_questions == 100 and gpu.data.test_questions == 500
    assert gpu.data.corpus.source == "name" and gpu.strategy.passages == 5 and gpu.generator.backend == "vllm"
    assert gpu.data.corpus.name == ("wiki2017-abstracts" if name == "hotpotqa" else "wiki2018-dpr")
    assert gpu.retriever.backend == "bm25"
    cpu = load_config(SelfTrainConfig, REPO_ROOT / "recipes" / "configs" / f"selftrain_paper_{name}_cpu.yaml")
    assert cpu.data.corpus.source == "contexts" and cpu.data.train.endswith(":train") and cpu.data.dev.endswith(":dev")


@pytest.mark.parametrize("name", PAPER)
def test_the_cpu_paper_configs_validate_after_fetch(server, name):
    from knowtrace_train.config import load_config
    from knowtrace_train.selftrain.config import SelfTrainConfig

    cfg = load_config(SelfTrainConfig, REPO_ROOT / "recipes" / "configs" / f"selftrain_paper_{name}_cpu.yaml")
    with pytest.raises(FetchError, match="is not fetched yet"):
        cfg.validate()
    fetch(cfg.data.train.split(":")[0], log=_say)
    cfg.validate()


def test_evaluate_runs_end_to_end_on_a_named_split_and_corpus(server, cache, tiny_model_dir, tmp_path):
    fetch("hotpotqa", log=_say)
    fetch("wiki2017-abstracts", log=_say)
    out = tmp_path / "named.jsonl"
    cmd = [sys.executable, str(REPO_ROOT / "recipes" / "evaluate.py"), "--config", str(REPO_ROOT / "recipes" / "configs" / "eval_world.yaml"),
           "--dataset.path", "hotpotqa:dev", "--corpus.source", "name", "--corpus.name", "wiki2017-abstracts", "--limit", "1",
           "--output", str(out), "--generator.model", str(tiny_model_dir), "--generator.progress", "false",
           "--retriever.cache_dir", "null", "--strategy.max_rounds", "1", "--strategy.passages", "2",
           "--strategy.max_new_tokens.explore", "8", "--strategy.max_new_tokens.complete", "8", "--strategy.max_new_tokens.answer", "4",
           "--quiet"]
    r = subprocess.run(cmd, capture_output=True, text=True, cwd=REPO_ROOT, timeout=600, env={**__import__("os").environ})
    assert r.returncode == 0, r.stderr[-3000:]
    assert json.loads(r.stdout.strip().splitlines()[-1])["questions"] == 1
    assert json.loads(out.read_text().splitlines()[0])["question_id"] == HOTPOT_DEV["_id"]


# -- the real samples (../shared/data): the fetched formats read as today's loaders read the official files --


def test_real_samples_read_alike_through_the_fetched_formats(shared_data, tmp_path, cache):
    hp = json.loads((shared_data / "hotpotqa" / "dev.json").read_text(encoding="utf-8"))
    root = write_sources(tmp_path / "sources", hotpot_dev=hp, wiki2_dev=json.loads(
        (shared_data / "2wikimultihopqa" / "dev.json").read_text(encoding="utf-8")),
        musique_dev=(shared_data / "musique" / "dev.jsonl").read_text(encoding="utf-8"))
    fetch("hotpotqa", mirror=root / "hub", log=_say)  # the hub's parquet
    fetch("2wikimultihopqa", mirror=root / "files", log=_say)
    fetch("musique", mirror=root / "files", log=_say)
    assert load_items("hotpotqa:dev") == load_items(shared_data / "hotpotqa" / "dev.json")
    assert len(load_items("hotpotqa:dev")) == 100
    assert load_items("2wikimultihopqa:dev") == load_items(shared_data / "2wikimultihopqa" / "dev.json")
    assert load_items("musique:dev") == load_items(shared_data / "musique" / "dev.jsonl")


def test_stats_verify_and_the_report_read_a_fetched_split(server, cache, tmp_path, capsys):
    folder, _ = fetch("musique", log=_say)
    assert data_main(["stats", "musique:dev"]) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["by_dataset"] == {"musique": 1}
    assert data_main(["fetch", "musique", "--verify"]) == 0
    (folder / "musique_ans_v1.0_dev.jsonl").write_text(jsonl([MUSIQUE_DEV]) + "\n")  # changed after the fetch
    with pytest.raises(FetchError, match="missing or not the .* bytes fetched: run python -m knowtrace_train.data fetch --verify musique"):
        load_items("musique:dev")
    assert data_main(["fetch", "musique", "--verify"]) == 2
    assert "musique_ans_v1.0_dev.jsonl: checksum mismatch" in capsys.readouterr().err
    (folder / "musique_ans_v1.0_dev.jsonl").unlink()
    assert data_main(["fetch", "musique"]) == 0  # extracted again from the fetched zip
    from knowtrace_train.report_html.lookups import Lookups

    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("data:\n  train: musique:train\n  dev: musique:dev\n  corpus: {source: name, name: wiki2018-dpr}\n")
    lookups = Lookups()
    lookups.add_run_inputs(run)
    assert lookups.question("2hop__482757_12019") == {"hops": 2, "kind": "2hop"} and not lookups.notes


# -- the sources as they behave: pages, Drive's form, redirects, dropped connections, paginated listings ---


def _answer(status: int, body: bytes, content_type: str = "application/octet-stream", extra: dict | None = None,
            cut: int | None = None):
    """A route answer: `body` with `status` (cut after `cut` bytes, the connection closed, where given)."""
    def handler(h):
        h.send_response(status)
        h.send_header("Content-Type", content_type)
        h.send_header("Content-Length", str(len(body)))
        for k, v in (extra or {}).items():
            h.send_header(k, v)
        h.end_headers()
        h.wfile.write(body[:cut] if cut is not None else body)
        if cut is not None:
            h.wfile.flush()
            h.close_connection = True
    return handler


def _no_wait(monkeypatch):
    monkeypatch.setattr(download_mod, "RETRY_WAIT", 0.0)


def test_an_html_page_where_a_zip_belongs_is_one_line_and_nothing_is_kept(server, cache, capsys):
    page = b"<!DOCTYPE html><html><head><title>Sign in</title></head><body>Log in to Dropbox</body></html>"
    server.routes["/files/data_ids_april7.zip"] = _answer(200, page, "text/html; charset=utf-8")
    assert data_main(["fetch", "2wikimultihopqa"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert "2wikimultihopqa: " in err and f"{server.url}/files/data_ids_april7.zip returned an HTML page" in err
    assert "text/html" in err and "<!DOCTYPE html>" in err and "where data_ids_april7.zip belongs; nothing was kept" in err
    folder = cache / "data" / "2wikimultihopqa" / "2021-04-07"
    assert not [p for p in folder.rglob("*") if p.is_file()]
    del server.routes["/files/data_ids_april7.zip"]  # the source answers again: the file, checked, read
    assert data_main(["fetch", "2wikimultihopqa"]) == 0


def test_a_json_error_where_a_json_file_belongs_and_a_403_are_one_line(server, cache, capsys):
    server.routes["/files/hotpot_train_v1.1.json"] = _answer(200, b"Forbidden\n", "text/plain")
    assert data_main(["fetch", "hotpotqa", "--source", "url"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "returned not a json file" in err and "b'Forbidden\\n'" in err
    server.routes["/files/hotpot_train_v1.1.json"] = _answer(403, b"no", "text/plain")
    assert data_main(["fetch", "hotpotqa", "--source", "url"]) == 2
    assert "hotpot_train_v1.1.json: HTTP 403" in capsys.readouterr().err


def test_a_page_saved_by_an_older_fetch_is_removed_and_fetched_again_never_reused(server, cache, capsys):
    folder = cache / "data" / "musique" / "v1.0"
    folder.mkdir(parents=True)
    (folder / "musique_v1.0.zip").write_bytes(b"<html><body>Google Drive - Virus scan warning</body></html>")
    fetch("musique", log=_say)  # no lock records it: checked as a download is, removed, fetched again
    assert load_items("musique:dev")[0].id == MUSIQUE_DEV["id"]


def test_a_cut_archive_from_a_mirror_is_one_line_and_removed(tmp_path, cache, capsys):
    mirror = write_sources(tmp_path / "sources") / "files"
    whole = (mirror / "musique_v1.0.zip").read_bytes()
    (mirror / "musique_v1.0.zip").write_bytes(whole[: len(whole) // 2])
    assert data_main(["fetch", "musique", "--mirror", str(mirror)]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "musique: musique_v1.0.zip is not a whole zip archive" in err
    assert "check the mirror's copy" in err
    assert not (cache / "data" / "musique" / "v1.0" / "musique_v1.0.zip").exists()  # never reused
    (mirror / "musique_v1.0.zip").write_bytes(whole)
    assert data_main(["fetch", "musique", "--mirror", str(mirror)]) == 0


def _drive_form(action: str, file_id: str, uuid: str) -> bytes:
    """Google Drive's virus-scan page as drive.usercontent.google.com serves it for a large file (its shape as
    gdown and others parse it: a form id="download-form", GET, hidden inputs id, export, confirm, uuid)."""
    return (f'<!DOCTYPE html><html><head><title>Google Drive - Virus scan warning</title></head><body>'
            f'<div class="uc-main"><div id="uc-text"><p class="uc-warning-caption">Google Drive can\'t scan this file '
            f'for viruses.</p><p class="uc-warning-subcaption"><span class="uc-name-size"><a href="/open?id={file_id}">'
            f'musique_v1.0.zip</a> (1.4G)</span> is too large for Google to scan for viruses. Would you still like to '
            f'download this file?</p><form id="download-form" action="{action}" method="get">'
            f'<input type="submit" id="uc-download-link" class="goog-inline-block jfk-button jfk-button-action" '
            f'value="Download anyway"/><input type="hidden" name="id" value="{file_id}">'
            f'<input type="hidden" name="export" value="download"><input type="hidden" name="confirm" value="t">'
            f'<input type="hidden" name="uuid" value="{uuid}"></form></div></div></body></html>').encode()


def test_drives_confirmation_form_is_read_and_followed(server, cache, monkeypatch):
    import dataclasses as dc

    file_id, uuid = "1tGdADlNjWFaHLeZZGShh2IRcpO6Lv24h", "6f1b0a4c-2b1e-4d7e-9f3a-0c5d8e7a1b2c"
    zip_bytes = (Path(server.root) / "files" / "musique_v1.0.zip").read_bytes()
    host = server.url.split("://", 1)[1]
    monkeypatch.setattr(download_mod, "_DRIVE_HOSTS", download_mod._DRIVE_HOSTS + (host,))

    def drive(h):
        query = dict(__import__("urllib.parse").parse.parse_qsl(h.path.split("?", 1)[1]))
        if query.get("uuid") == uuid and query.get("confirm") == "t" and query.get("id") == file_id:
            return _answer(200, zip_bytes, "application/octet-stream")(h)
        return _answer(200, _drive_form(f"{server.url}/download", file_id, uuid), "text/html; charset=utf-8")(h)

    server.routes["/download"] = drive
    e = registry.REGISTRY["musique"]
    s = e.sources[0]
    files = (dc.replace(s.files[0], url=f"{server.url}/download?id={file_id}&export=download&confirm=t"),)
    monkeypatch.setitem(registry.REGISTRY, "musique", dc.replace(e, sources=(dc.replace(s, files=files),)))
    fetch("musique", log=_say)
    assert load_items("musique:dev")[0].id == MUSIQUE_DEV["id"]
    asked = [p for p, _ in server.requests if p.startswith("/download")]
    assert len(asked) == 2 and f"uuid={uuid}" in asked[1] and "confirm=t" in asked[1]
    # Drive's quota page: one line saying so
    quota = (b'<html><body><div class="uc-main"><p class="uc-error-caption">Sorry, you can&#39;t view or download this '
             b'file at this time.</p><p class="uc-error-subcaption">Too many users have viewed or downloaded this file '
             b'recently. Please try accessing the file again later.</p></div></body></html>')
    server.routes["/download"] = _answer(200, quota, "text/html")
    (cache / "data" / "musique" / "v1.0" / registry.LOCK_NAME).unlink()
    (cache / "data" / "musique" / "v1.0" / "musique_v1.0.zip").unlink()
    with pytest.raises(FetchError) as err:
        fetch("musique", log=_say)
    line = str(err.value)
    assert "\n" not in line and "Google Drive answered a page, not the file (Too many users have viewed" in line
    assert "download quota for this file is used up: try again in 24 hours" in line and "--mirror DIR" in line


def test_a_token_goes_only_to_the_host_it_belongs_to(server, cache, tmp_path, monkeypatch):
    cdn = Server(server.root, host="127.0.0.2")  # the hub's CDN: another host
    try:
        resolve = f"/datasets/{fetch_fixtures.REPO}/resolve/{COMMIT}/"

        def to_cdn(h):
            h.send_response(302)
            h.send_header("Location", f"{cdn.url}/files-hub/{h.path[len(resolve):]}")
            h.send_header("Content-Length", "0")
            h.end_headers()

        def cdn_file(h):
            return _answer(200, (Path(server.root) / "hub" / h.path[len("/files-hub/"):]).read_bytes())(h)

        server.routes[resolve] = to_cdn
        cdn.routes["/files-hub/"] = cdn_file
        monkeypatch.setenv("HF_TOKEN", "hf_secret")
        fetch("hotpotqa", log=_say)
        assert load_items("hotpotqa:dev") == [expected_hotpot_dev()]
        sent_hub = [h.get("Authorization") for h in server.headers]
        sent_cdn = [h.get("Authorization") for h in cdn.headers]
        assert sent_hub and all(a == "Bearer hf_secret" for a in sent_hub)  # the hub's own routes carry it
        assert len(sent_cdn) == 4 and all(a is None for a in sent_cdn)  # the other host never sees it
    finally:
        cdn.close()


def test_a_redirect_on_the_same_host_keeps_the_token(server, cache, monkeypatch):
    resolve = f"/datasets/{fetch_fixtures.REPO}/resolve/{COMMIT}/"

    def moved(h):
        h.send_response(302)
        h.send_header("Location", f"/moved/{h.path[len(resolve):]}")
        h.send_header("Content-Length", "0")
        h.end_headers()

    server.routes[resolve] = moved
    server.routes["/moved/"] = lambda h: _answer(200, (Path(server.root) / "hub" / h.path[len("/moved/"):]).read_bytes())(h)
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    fetch("hotpotqa", log=_say)
    moved_headers = [hd for (p, _), hd in zip(server.requests, server.headers) if p.startswith("/moved/")]
    assert len(moved_headers) == 4 and all(hd.get("Authorization") == "Bearer hf_secret" for hd in moved_headers)


def test_a_body_cut_midway_resumes_with_a_range_request(server, cache, monkeypatch):
    _no_wait(monkeypatch)
    data = (Path(server.root) / "files" / "psgs_w100.tsv.gz").read_bytes()
    calls = {"n": 0}

    def flaky(h):
        calls["n"] += 1
        rng = h.headers.get("Range")
        start = int(rng.split("=")[1].split("-")[0]) if rng else 0
        rest = data[start:]
        if calls["n"] == 1:  # the first answer promises the whole file and stops half-way
            return _answer(200, rest, cut=len(rest) // 2)(h)
        extra = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"}
        return _answer(206, rest, extra=extra)(h)

    server.routes["/files/psgs_w100.tsv.gz"] = flaky
    fetch("wiki2018-dpr", log=_say)
    ranges = [r for p, r in server.requests if p == "/files/psgs_w100.tsv.gz"]
    assert ranges == [None, f"bytes={len(data) // 2}-"]
    assert len(read_named_corpus("wiki2018-dpr")) == 2


def test_a_connection_that_keeps_dropping_is_one_line_after_bounded_retries(server, cache, monkeypatch, capsys):
    _no_wait(monkeypatch)
    data = (Path(server.root) / "files" / "psgs_w100.tsv.gz").read_bytes()

    def always_cut(h):
        rng = h.headers.get("Range")
        start = int(rng.split("=")[1].split("-")[0]) if rng else 0
        extra = {"Content-Range": f"bytes {start}-{len(data) - 1}/{len(data)}"} if rng else {}
        return _answer(206 if rng else 200, data[start:], extra=extra, cut=2)(h)

    server.routes["/files/psgs_w100.tsv.gz"] = always_cut
    assert data_main(["fetch", "wiki2018-dpr"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1
    assert f"wiki2018-dpr: {server.url}/files/psgs_w100.tsv.gz: the connection dropped {download_mod.RETRIES + 1} times" in err
    assert f"of {len(data)} bytes of psgs_w100.tsv.gz in psgs_w100.tsv.gz.part); run fetch again to resume" in err
    assert len([p for p, _ in server.requests if p == "/files/psgs_w100.tsv.gz"]) == download_mod.RETRIES + 1
    del server.routes["/files/psgs_w100.tsv.gz"]
    assert data_main(["fetch", "wiki2018-dpr"]) == 0  # the next fetch resumes from the part


def test_a_hub_listing_over_several_pages_is_read_whole(server, cache):
    server.page_size = 1  # the train folder's two shards come on two pages
    folder, lock = fetch("hotpotqa", log=_say)
    assert {"distractor/train-00000-of-00002.parquet", "distractor/train-00001-of-00002.parquet"} <= set(lock["files"])
    assert len(load_items("hotpotqa:train")) == 2
    assert any("cursor=1" in p for p, _ in server.requests)


def test_a_publisher_size_and_md5_are_checked(server, cache, monkeypatch, capsys):
    import dataclasses as dc
    import hashlib

    data = (Path(server.root) / "files" / "psgs_w100.tsv.gz").read_bytes()
    e = registry.REGISTRY["wiki2018-dpr"]
    s = e.sources[0]

    def pin(**kw):
        files = (dc.replace(s.files[0], **kw),)
        monkeypatch.setitem(registry.REGISTRY, "wiki2018-dpr", dc.replace(e, sources=(dc.replace(s, files=files),)))

    pin(size=len(data), md5="0" * 32)
    assert data_main(["fetch", "wiki2018-dpr"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "psgs_w100.tsv.gz: checksum mismatch (MD5" in err and "the publisher gives " + "0" * 32 in err
    assert not list((cache / "data" / "wiki2018-dpr" / "dpr-psgs-w100").glob("psgs*"))
    pin(size=len(data), md5=hashlib.md5(data).hexdigest())
    assert data_main(["fetch", "wiki2018-dpr"]) == 0


def test_the_published_size_and_md5_are_pinned_where_a_publisher_gives_them():
    f = registry.REGISTRY["wiki2017-abstracts"].sources[0].files[0]
    assert (f.size, f.md5) == (1_553_565_403, "01edf64cd120ecc03a2745352779514c")  # hotpotqa.github.io/wiki-readme.html
    pinned = {(e.name, x.path) for e in registry.REGISTRY.values() for s in e.sources for x in s.files if x.md5 or x.sha256}
    assert pinned == {("wiki2017-abstracts", f.path)}  # the rest: recorded at first fetch (docs/data.md's table)
