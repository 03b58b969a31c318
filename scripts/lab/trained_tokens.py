"""Share of each method's gold-bootstrap completion words that the engine feeds (the response prefix) rather than
the model writes. Before the change the SFT completion was prefix + generated text (loss on both); now the prefix is
prompt-side. The default run's 64 bootstrap questions of the world, BM25 over the world's corpus, each method's
default settings, words counted by whitespace.
    python scripts/lab/trained_tokens.py

The last line is JSON."""
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from knowtrace_train.config import load_config
from knowtrace_train.evaluate import EvalConfig, load_corpus
from knowtrace_train.methods import METHODS, get_method
from knowtrace_train.retrieval import build_retriever
from knowtrace_train.selftrain.config import SelfTrainConfig, has_gold_trajectories
from knowtrace_train.selftrain.loop import select_questions

cfg = load_config(SelfTrainConfig, None, [])
q = select_questions(cfg, bootstrap=True)
corpus = load_corpus(EvalConfig(corpus=cfg.data.corpus), q.all_items)
retriever = build_retriever(cfg.retriever, corpus)
out = {}
for name, m in METHODS.items():
    if not has_gold_trajectories(m):
        continue
    res = m.gold_records(m.config_class(), q.bootstrap, retriever, fewshot=cfg.fewshot_trained, require_support=True,
                         count_tokens=lambda s: len(s.split()), iteration=0)
    fed = gen = recs = 0
    for rs in res.records_by_role.values():
        for r in rs:
            recs += 1
            fed += len(r.get("prefix", "").split())
            gen += len(r["completion"].split())
    out[name] = {"records": recs, "fed_words": fed, "generated_words": gen,
                 "generated_share_before": round(gen / (fed + gen), 3) if fed + gen else None}
    print(name, out[name], flush=True)
print(json.dumps(out))
