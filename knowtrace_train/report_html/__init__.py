"""The HTML report: one self-contained page per run (or pair of runs, or trajectory file), with the traced graphs.

    collect.py    run folders and trajectory files -> the page model (run view rows, chart series, questions)
    questions.py  one trajectory -> its question view (calls by round, the graph, the method's highlights)
    lookups.py    hops and kinds from the data files, passage texts from the corpus, `Method.explain`
    assets/       report.js and report.css, inlined into the page (nothing is fetched when it is viewed)

`write_report(paths, out)` writes the page; `scripts/report.py` is its command line. The page model is
embedded as JSON in a `<script type="application/json">` with `<`, `>`, `&` and the JavaScript line
separators escaped, and the page's script builds every element from it with `textContent`: model text
can never become markup or script.
"""

from __future__ import annotations

import datetime
import json
from pathlib import Path
from typing import Any, Sequence

from knowtrace_train.io import atomic_write_text
from knowtrace_train.report_html.collect import collect

ASSETS = Path(__file__).resolve().parent / "assets"


def embed_json(obj: Any) -> str:
    """JSON that is inert inside a `<script>` element (no `</script>`, no `<!--`, no line separators)."""
    text = json.dumps(obj, ensure_ascii=False, allow_nan=False, default=str)
    for ch, esc in (("&", "\\u0026"), ("<", "\\u003c"), (">", "\\u003e"), ("\u2028", "\\u2028"), ("\u2029", "\\u2029")):
        text = text.replace(ch, esc)
    return text


def _html_text(s: str) -> str:
    return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def render_page(model: dict[str, Any], title: str) -> str:
    """The page: inlined style and script, the model as JSON."""
    css = (ASSETS / "report.css").read_text(encoding="utf-8")
    js = (ASSETS / "report.js").read_text(encoding="utf-8")
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\n"
        "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; img-src data:; "
        "style-src 'unsafe-inline'; script-src 'unsafe-inline'\">\n"
        f"<title>{_html_text(title)}</title>\n<style>\n{css}\n</style></head>\n"
        "<body><div id=\"app\"><p id=\"loading\">Loading the report (this page needs JavaScript).</p></div>\n"
        f"<script type=\"application/json\" id=\"report-data\">{embed_json(model)}</script>\n"
        f"<script>\n{js}\n</script>\n</body></html>\n"
    )


def _clean(obj: Any) -> Any:
    """NaN and infinities (which JSON cannot carry) as None, recursively."""
    if isinstance(obj, float) and (obj != obj or obj in (float("inf"), float("-inf"))):
        return None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def write_report(paths: Sequence[str | Path], out: str | Path, *, data_files: Sequence[str | Path] = (),
                 corpus: str | Path | None = None, title: str | None = None) -> dict[str, Any]:
    """Write the report of `paths` (run folders, trajectory files) to `out`; returns its figures
    (file, size, runs, questions, notes)."""
    model = _clean(collect(list(paths), list(data_files), corpus))
    title = title or "knowtrace-train report: " + ", ".join(r["name"] for r in model["runs"])
    model["title"] = title
    model["generated"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    html = render_page(model, title)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(out, html)
    notes = model["notes"] + [n for r in model["runs"] for n in r["notes"]]
    return {"report": str(out), "bytes": len(html.encode("utf-8")), "runs": len(model["runs"]),
            "questions": len(model["questions"]), "notes": len(notes)}


__all__ = ["collect", "embed_json", "render_page", "write_report"]
