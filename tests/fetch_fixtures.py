"""Small copies of what each registry source serves, in its exact schema and encoding, and a local server for them.

`write_sources(root)` lays out under `root`:
  hub/distractor/train-0000{0,1}-of-00002.parquet, hub/distractor/validation-00000-of-00001.parquet,
  hub/fullwiki/validation-00000-of-00001.parquet   the hub's hotpotqa/hotpot_qa (nested struct columns)
  files/hotpot_*.json                              HotpotQA's official JSON arrays
  files/data_ids_april7.zip                        2Wiki's release: data_ids_april7/{train,dev,test,id_aliases}.json
  files/musique_v1.0.zip                           MuSiQue's release: data/musique_{ans,full}_v1.0_*.jsonl
  files/MINTQA-{POP,TI}.json                       MINTQA's release: JSON Lines
  files/enwiki-...-abstracts.tar.bz2               HotpotQA's abstracts: a tar.bz2 of bz2 JSON Lines
  files/psgs_w100.tsv.gz                           DPR's passages: gzipped, tab-separated, csv-quoted

`Server(root)` serves them over HTTP as the hub (HF_ENDPOINT) and the official addresses do, Range requests
included, and records each request's path and Range header.
"""

from __future__ import annotations

import bz2
import csv
import dataclasses
import gzip
import hashlib
import io
import json
import tarfile
import threading
import zipfile
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "hotpotqa/hotpot_qa"

ED_WOOD = ["Edward Davis Wood Jr. was an American filmmaker.", " He was born in 1924."]
DERRICKSON = ["Scott Derrickson is an American director.", " He lives in Los Angeles."]

HOTPOT_DEV = {
    "_id": "5a8b57f25542995d1e6f1371", "answer": "yes",
    "question": "Were Scott Derrickson and Ed Wood of the same nationality?",
    "supporting_facts": [["Scott Derrickson", 0], ["Ed Wood", 0]],
    "context": [["Ed Wood", ED_WOOD], ["Scott Derrickson", DERRICKSON]],
    "type": "comparison", "level": "hard",
}
HOTPOT_TRAIN = [
    {"_id": "5a7a06935542990198eaf050", "answer": "Arthur's Magazine",
     "question": "Which magazine was started first, Arthur's Magazine or First for Women?",
     "supporting_facts": [["Arthur's Magazine", 0], ["First for Women", 0]],
     "context": [["Arthur's Magazine", ["Arthur's Magazine (1844–1846) was an American literary periodical."]],
                 ["First for Women", ["First for Women is a woman's magazine published by Bauer Media Group.", " It was started in 1989."]]],
     "type": "comparison", "level": "medium"},
    {"_id": "5a879ab05542996e4f30887e", "answer": "Delhi",
     "question": "The Oberoi family is part of a hotel company that has a head office in what city?",
     "supporting_facts": [["Oberoi family", 0], ["The Oberoi Group", 0]],
     "context": [["Oberoi family", ["The Oberoi family is an Indian family famous for its involvement in hotels."]],
                 ["The Oberoi Group", ["The Oberoi Group is a hotel company with its head office in Delhi."]]],
     "type": "bridge", "level": "easy"},
]
HOTPOT_FULLWIKI = {**HOTPOT_DEV, "_id": "5ab3b0bf5542992ade7c6e39", "question": "Was Ed Wood American?"}

WIKI2_DEV = {
    "_id": "13f5ad2c088c11ebbd6fac1f6bf848b6", "type": "compositional",
    "question": "Who is the mother of the director of film Polish-Russian War?",
    "context": [["Polish-Russian War (film)", ["Polish-Russian War is a 2009 Polish film directed by Xawery Żuławski."]],
                ["Xawery Żuławski", ["Xawery Żuławski is a Polish film director.", "His mother is Małgorzata Braunek."]]],
    "entity_ids": "Q7208955_Q170105",
    "supporting_facts": [["Polish-Russian War (film)", 0], ["Xawery Żuławski", 1]],
    "evidences": [["Polish-Russian War", "director", "Xawery Żuławski"], ["Xawery Żuławski", "mother", "Małgorzata Braunek"]],
    "answer": "Małgorzata Braunek", "evidences_id": [], "answer_id": "Q274893",
}
WIKI2_TRAIN = {**WIKI2_DEV, "_id": "a0b1c2d3e4f5", "question": "Who directed Polish-Russian War?", "answer": "Xawery Żuławski",
               "supporting_facts": [["Polish-Russian War (film)", 0]], "evidences": [["Polish-Russian War", "director", "Xawery Żuławski"]]}

#: 2Wiki's id_aliases.json (JSON Lines, beside train.json in the release zip): the answer's Wikidata id's aliases
#: and demonyms, which its v1.1 evaluation script adds to the gold answers
WIKI2_ALIASES = [
    {"Q_id": "Q274893", "aliases": ["Malgorzata Braunek", "Małgorzata Braunek"], "demonyms": []},
    {"Q_id": "Q36", "aliases": ["Republic of Poland"], "demonyms": ["Polish", "Pole"]},
]

MUSIQUE_DEV = {
    "id": "2hop__482757_12019",
    "paragraphs": [
        {"idx": 0, "title": "Pakistan Super League", "paragraph_text": "The Pakistan Super League is a Twenty20 cricket league.", "is_supporting": False},
        {"idx": 1, "title": "Serena Williams", "paragraph_text": "Serena Williams's elder sister is Venus Williams.", "is_supporting": True},
        {"idx": 2, "title": "Venus Williams", "paragraph_text": "Venus Williams won her first Wimbledon title in 2000.", "is_supporting": True},
    ],
    "question": "When did Serena Williams's elder sister win her first Wimbledon title?",
    "question_decomposition": [
        {"id": 482757, "question": "Who is Serena Williams's elder sister?", "answer": "Venus Williams", "paragraph_support_idx": 1},
        {"id": 12019, "question": "When did #1 win her first Wimbledon title?", "answer": "2000", "paragraph_support_idx": 2},
    ],
    "answer": "2000", "answer_aliases": ["two thousand"], "answerable": True,
}
MUSIQUE_TRAIN = {**MUSIQUE_DEV, "id": "2hop__1_2", "question": "Who is the elder sister of Serena Williams?", "answer": "Venus Williams",
                 "answer_aliases": [], "question_decomposition": MUSIQUE_DEV["question_decomposition"][:1] + [
                     {"id": 2, "question": "#1", "answer": "Venus Williams", "paragraph_support_idx": 2}]}

#: MINTQA's release (github.com/probe2/multi-hop): MINTQA-POP.json / MINTQA-TI.json, one JSON object a line, the
#: fields its README lists (question, answer, type = per-hop knowledge labels, num_hops, subquestion, subanswer,
#: triple = the Wikidata chain, facts); the value shapes (lists per hop) are as that README and the paper describe
MINTQA_POP = [
    {"question": "Who is the head coach of the team that Kevin Durant plays for?", "answer": "Mike Budenholzer",
     "type": ["popular", "unpopular"], "num_hops": 2,
     "subquestion": ["Which team does Kevin Durant play for?", "Who is the head coach of Phoenix Suns?"],
     "subanswer": ["Phoenix Suns", "Mike Budenholzer"],
     "triple": [["Kevin Durant", "member of sports team", "Phoenix Suns"], ["Phoenix Suns", "head coach", "Mike Budenholzer"]],
     "facts": ["Kevin Durant plays for Phoenix Suns.", "The head coach of Phoenix Suns is Mike Budenholzer."]},
]
MINTQA_TI = [
    {"question": "Who is the head of government of Senegal?", "answer": "Ousmane Sonko", "type": "new", "num_hops": 1,
     "subquestion": ["Who is the head of government of Senegal?"], "subanswer": ["Ousmane Sonko"],
     "triple": [["Senegal", "head of government", "Ousmane Sonko"]], "facts": ["The head of government of Senegal is Ousmane Sonko."]},
]

ABSTRACTS = [
    {"id": "12", "url": "https://en.wikipedia.org/wiki?curid=12", "title": "Ed Wood", "text": ED_WOOD,
     "charoffset": [[[0, 7]], [[0, 3]]], "text_with_links": ED_WOOD, "charoffset_with_links": [[[0, 7]], [[0, 3]]]},
    {"id": "25", "url": "https://en.wikipedia.org/wiki?curid=25", "title": "Empty redirect", "text": [],
     "charoffset": [], "text_with_links": [], "charoffset_with_links": []},
]
ABSTRACTS_2 = [
    {"id": "39", "url": "https://en.wikipedia.org/wiki?curid=39", "title": "Scott Derrickson", "text": DERRICKSON,
     "charoffset": [], "text_with_links": DERRICKSON, "charoffset_with_links": []},
]
DPR_ROWS = [["1", 'Aaron Aaron ( or ; "Ahärôn") is a prophet, high priest, and the brother of Moses.', "Aaron"],
            ["2", "God at Sinai granted Aaron the priesthood for himself and his male descendants.", "Aaron"]]


def hub_row(row: dict) -> dict:
    """An official HotpotQA item as the hub's parquet row holds it."""
    return {"id": row["_id"], "question": row["question"], "answer": row["answer"], "type": row["type"], "level": row["level"],
            "supporting_facts": {"title": [t for t, _ in row["supporting_facts"]], "sent_id": [i for _, i in row["supporting_facts"]]},
            "context": {"title": [t for t, _ in row["context"]], "sentences": [s for _, s in row["context"]]}}


def write_parquet(path: Path, rows: list[dict]) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    schema = pa.schema([
        ("id", pa.string()), ("question", pa.string()), ("answer", pa.string()), ("type", pa.string()), ("level", pa.string()),
        ("supporting_facts", pa.struct([("title", pa.list_(pa.string())), ("sent_id", pa.list_(pa.int32()))])),
        ("context", pa.struct([("title", pa.list_(pa.string())), ("sentences", pa.list_(pa.list_(pa.string())))])),
    ])
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist([hub_row(r) for r in rows], schema=schema), path)


def zip_of(path: Path, members: dict[str, str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, text in members.items():
            z.writestr(name, text)


def jsonl(rows: list[dict]) -> str:
    return "".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows)


def write_sources(root: Path, *, hotpot_dev: list[dict] | None = None, wiki2_dev: list[dict] | None = None,
                  musique_dev: str | None = None) -> Path:
    hub, files = root / "hub", root / "files"
    write_parquet(hub / "distractor/train-00000-of-00002.parquet", HOTPOT_TRAIN[:1])
    write_parquet(hub / "distractor/train-00001-of-00002.parquet", HOTPOT_TRAIN[1:])
    write_parquet(hub / "distractor/validation-00000-of-00001.parquet", hotpot_dev or [HOTPOT_DEV])
    write_parquet(hub / "fullwiki/validation-00000-of-00001.parquet", [HOTPOT_FULLWIKI])
    files.mkdir(parents=True, exist_ok=True)
    (files / "hotpot_train_v1.1.json").write_text(json.dumps(HOTPOT_TRAIN), encoding="utf-8")
    (files / "hotpot_dev_distractor_v1.json").write_text(json.dumps(hotpot_dev or [HOTPOT_DEV]), encoding="utf-8")
    (files / "hotpot_dev_fullwiki_v1.json").write_text(json.dumps([HOTPOT_FULLWIKI]), encoding="utf-8")
    zip_of(files / "data_ids_april7.zip", {
        "data_ids_april7/train.json": json.dumps([WIKI2_TRAIN], ensure_ascii=False),
        "data_ids_april7/dev.json": json.dumps(wiki2_dev or [WIKI2_DEV], ensure_ascii=False),
        "data_ids_april7/test.json": json.dumps([{k: v for k, v in WIKI2_DEV.items() if k in ("_id", "type", "question", "context")}]),
        "data_ids_april7/id_aliases.json": jsonl(WIKI2_ALIASES),
    })
    zip_of(files / "musique_v1.0.zip", {
        "data/musique_ans_v1.0_train.jsonl": jsonl([MUSIQUE_TRAIN]),
        "data/musique_ans_v1.0_dev.jsonl": musique_dev if musique_dev is not None else jsonl([MUSIQUE_DEV]),
        "data/musique_ans_v1.0_test.jsonl": jsonl([{"id": "2hop__9_9", "paragraphs": [], "question": "?"}]),
        "data/musique_full_v1.0_dev.jsonl": jsonl([MUSIQUE_DEV]),
    })
    (files / "MINTQA-POP.json").write_text(jsonl(MINTQA_POP), encoding="utf-8")
    (files / "MINTQA-TI.json").write_text(jsonl(MINTQA_TI), encoding="utf-8")
    tar = files / "enwiki-20171001-pages-meta-current-withlinks-abstracts.tar.bz2"
    with tarfile.open(tar, "w:bz2") as t:
        for sub, rows in (("AA", ABSTRACTS), ("AB", ABSTRACTS_2)):
            data = bz2.compress(jsonl(rows).encode("utf-8"))
            info = tarfile.TarInfo(f"enwiki-20171001-pages-meta-current-withlinks-abstracts/{sub}/wiki_00.bz2")
            info.size = len(data)
            t.addfile(info, io.BytesIO(data))
    buf = io.StringIO()
    w = csv.writer(buf, delimiter="\t", lineterminator="\n")
    w.writerow(["id", "text", "title"])
    w.writerows(DPR_ROWS)
    (files / "psgs_w100.tsv.gz").write_bytes(gzip.compress(buf.getvalue().encode("utf-8")))
    return root


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


class Server:
    """The hub API and file routes over `root`/hub, and `root`/files at /files/<name>; Range requests honoured."""

    def __init__(self, root: Path, host: str = "127.0.0.1") -> None:
        self.root = root
        self.requests: list[tuple[str, str | None]] = []
        #: every request's headers, in order (what a test checks a token against)
        self.headers: list[dict[str, str]] = []
        #: path prefix -> handler(request handler) that answers instead of the routes below (a test's own answer)
        self.routes: dict[str, object] = {}
        #: hub tree listings are split into pages of this many entries (a Link header names the next)
        self.page_size: int | None = None
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):  # quiet
                pass

            def do_GET(self):
                outer.requests.append((self.path, self.headers.get("Range")))
                outer.headers.append(dict(self.headers.items()))
                path = self.path.split("?", 1)[0]
                for prefix, answer in outer.routes.items():
                    if path.startswith(prefix):
                        return answer(self)
                api = f"/api/datasets/{REPO}/"
                if path == api + "revision/main":
                    return self._json({"sha": COMMIT, "id": REPO})
                if path.startswith(api + f"tree/{COMMIT}/"):
                    folder = outer.root / "hub" / path[len(api + f"tree/{COMMIT}/"):]
                    rows = [{"type": "file", "path": p.relative_to(outer.root / "hub").as_posix(), "size": p.stat().st_size,
                             "oid": "x", "lfs": {"oid": sha256(p), "size": p.stat().st_size, "pointerSize": 134}}
                            for p in sorted(folder.iterdir())] if folder.is_dir() else None
                    if rows is None:
                        return self.send_error(404)
                    if outer.page_size:
                        start = int(self.path.split("cursor=", 1)[1]) if "cursor=" in self.path else 0
                        more = start + outer.page_size < len(rows)
                        nxt = f'<{outer.url}{path}?cursor={start + outer.page_size}>; rel="next"' if more else None
                        return self._json(rows[start:start + outer.page_size], link=nxt)
                    return self._json(rows)
                resolve = f"/datasets/{REPO}/resolve/{COMMIT}/"
                if path.startswith(resolve):
                    return self._file(outer.root / "hub" / path[len(resolve):])
                if path.startswith("/files/"):
                    return self._file(outer.root / "files" / path[len("/files/"):])
                self.send_error(404)

            def _json(self, obj, link=None):
                body = json.dumps(obj).encode()
                self.send_response(200)
                if link:
                    self.send_header("Link", link)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _file(self, p: Path):
                if not p.is_file():
                    return self.send_error(404)
                data = p.read_bytes()
                rng = self.headers.get("Range")
                if rng:
                    start = int(rng.split("=")[1].split("-")[0])
                    self.send_response(206)
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                    data = data[start:]
                else:
                    self.send_response(200)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer((host, 0), Handler)
        self.url = f"http://{host}:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()


def point_urls_at(monkeypatch, base: str) -> None:
    """The registry's official addresses, served at `base`/files/<file name> (the same code downloads them); the
    publishers' pinned sizes and MD5s are left out (the fixtures are small copies, not the published files)."""
    from knowtrace_train.data import registry

    for name, e in list(registry.REGISTRY.items()):
        sources = tuple(
            dataclasses.replace(s, files=tuple(dataclasses.replace(f, url=f"{base}/files/{f.path}", size=None, md5=None)
                                               for f in s.files))
            if s.kind == "url" else s for s in e.sources)
        monkeypatch.setitem(registry.REGISTRY, name, dataclasses.replace(e, sources=sources))
