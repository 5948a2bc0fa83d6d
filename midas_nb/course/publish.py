"""Publishing the course edition: :func:`strip_solutions` (``midas-nb strip-solutions``) and the static HTML
edition of a run's executed notebooks (:func:`export_html`, ``midas-nb export-html``)."""
from __future__ import annotations

import html
import os
import re
import warnings
from pathlib import Path
from typing import Any

import nbformat

from ..config import project_root
from ..identity import atomic_write_text
from ..runs import run_state, RunState

SOLUTION_TAG = "solution"
_NOTEBOOK_GLOB = "[0-9][0-9]_*.ipynb"
_NAV_CSS = ("<style>.midas-nav{font:14px system-ui,sans-serif;display:flex;gap:1.5em;padding:.6em 1em;"
            "border-bottom:1px solid #ddd;background:#fafafa}.midas-nav.bottom{border-top:1px solid #ddd;"
            "border-bottom:0}.midas-nav a{text-decoration:none}</style>")

#: what the contents page repeats: the closing box's headline and claims (analysis.synthesis.box), the data caveat
_HEADLINE = re.compile(r"^This run (?:shows the decoupling|does not show a decoupling) — .*(?:\n\|.*)*", re.M)
_SYNTHETIC = re.compile(r"^Data: the embedded synthetic .*$", re.M)


def _run_header(input_dir: Path, run: RunState, pages: list, out: Path) -> str:
    """The contents page's header: dataset, run id and date, the headline verdict, a link to the report."""
    st, bits = run.settings, []
    data = st.get("dataset") or (Path(str(st["data_root"])).name if st.get("data_root") else "embedded default")
    bits.append(f"Run <code>{html.escape(run.latest)}</code> of {run.started}; profile <code>"
                f"{html.escape(str(st.get('profile', '?')))}</code>; data: {html.escape(str(data))}." if run.latest
                else "No copy here names its run (papermill's metadata of a midas-nb run): run id and date unknown.")
    def first(pattern: re.Pattern) -> str | None:
        return next((m.group(0) for _, nb, _, _ in pages for c in nb.cells if c.cell_type == "code"
                     for o in c.get("outputs", []) for m in [pattern.search(o.get("text", ""))] if m), None)

    synthetic, hit = first(_SYNTHETIC), first(_HEADLINE)
    if synthetic:
        bits.append(f"<strong>{html.escape(synthetic)}</strong>")
    if hit:
        head, _, claims = hit.partition("\n")
        bits.append(f"<strong>Headline:</strong> {html.escape(head)}"
                    + (f"</p>\n<pre>{html.escape(claims)}</pre><p>" if claims else ""))
    # a run's report: <run>/report; a run over several datasets: <run>/<dataset>/ beside <run>/report
    report = next((r for r in (input_dir / "report" / "REPORT.md", input_dir.parent / "report" / "REPORT.md")
                   if r.is_file()), None)
    if report is not None:
        href = Path(os.path.relpath(report.resolve(), out.resolve())).as_posix()
        bits.append(f'Report: <a href="{html.escape(href)}">report/REPORT.md</a>.')
    return "".join(f"<p>{b}</p>\n" for b in bits)


def _is_solution(cell) -> bool:
    return SOLUTION_TAG in cell.get("metadata", {}).get("tags", [])


def strip_solutions(path: str | Path, out: str | Path | None = None, force: bool = False) -> int:
    """Write notebook ``path`` without its cells tagged ``solution`` to ``out``: a file, a directory, or ``None``:
    ``<path's folder>/student/<same name>`` (a ``*_student`` suffix would match ``midas-nb run``'s ``NN_*.ipynb``);
    returns the number of removed cells. FileNotFoundError: no ``path``; FileExistsError: ``out`` differs (a
    student's edited copy) and not ``force``."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"notebook {str(path)!r} does not exist")
    nb = nbformat.read(str(path), as_version=4)
    before, nb.cells = len(nb.cells), [c for c in nb.cells if not _is_solution(c)]
    target = path.parent / "student" / path.name if out is None else Path(out)
    target = target / path.name if target.is_dir() else target
    nbformat.validate(nb)
    text = nbformat.writes(nb) + "\n"
    if not force and target.is_file() and not target.samefile(path) and target.read_text(encoding="utf-8") != text:
        raise FileExistsError(f"{target} differs from the student edition of {path} (edited since it was written?); "
                              f"it was kept")
    atomic_write_text(target, text)
    return before - len(nb.cells)


def _nav(prev: tuple[str, str] | None, nxt: tuple[str, str] | None, where: str) -> str:
    return (f'<nav class="midas-nav {where}"><a class="midas-contents" href="index.html">Contents</a>'
            + (f'<a class="midas-prev" rel="prev" href="{prev[0]}">← {html.escape(prev[1])}</a>' if prev else "")
            + (f'<a class="midas-next" rel="next" href="{nxt[0]}">{html.escape(nxt[1])} →</a>' if nxt else "")
            + "</nav>")


def jupyter_data_dir(distribution: str, relative: str) -> Path | None:
    """The Jupyter data folder (``<prefix>/share/jupyter``) where the installed ``distribution`` put the file
    ``relative`` to it, by its ``importlib.metadata`` record; ``None``: no such file (decision 0065)."""
    import importlib.metadata
    dist, depth = importlib.metadata.distribution(distribution), len(Path(relative).parts)
    return next((dist.locate_file(f).resolve().parents[depth - 1] for f in dist.files or ()
                 if str(f).endswith(relative)), None)


def _lab_exporter(exporter_class: type) -> Any:
    """nbconvert's lab HTML exporter, its template also sought where nbconvert is installed; FileNotFoundError: none."""
    found = jupyter_data_dir("nbconvert", "nbconvert/templates/lab/conf.json")
    root = [str(found / "nbconvert" / "templates")] if found is not None else []   # lab's own, and base/ it extends
    extra = {"extra_template_basedirs": root, "extra_template_paths": root} if root else {}
    try:
        return exporter_class(template_name="lab", embed_images=True, **extra)
    except ValueError as e:
        if "No template sub-directory" not in str(e):
            raise
    from jupyter_core.paths import jupyter_path
    raise FileNotFoundError(f"nbconvert's 'lab' HTML template is not in the Jupyter data paths "
                            f"({', '.join(jupyter_path())}){f' nor in {found}' if found else ''}; reinstall "
                            f"nbconvert in this environment (pip install --force-reinstall nbconvert)")


def _alt_texts(nb: Any, body: str) -> str:
    """``body`` with each image's ``alt`` metadata (:func:`midas_nb.viz.finish_figure`) as its alt text."""
    alts = {"".join(o["data"]["image/png"].split()): o["metadata"]["image/png"]["alt"]
            for c in nb.cells for o in c.get("outputs", [])
            if "image/png" in o.get("data", {}) and "alt" in o.get("metadata", {}).get("image/png", {})}

    def alt(m: re.Match) -> str:
        src = re.search(r'src="data:image/png;base64,([^"]+)"', m.group(0))
        text = alts.get(src.group(1)) if src else None
        return m.group(0) if text is None else re.sub(r'alt="[^"]*"', f'alt="{html.escape(text)}"', m.group(0))
    return re.sub(r'<img [^>]*alt="No description has been provided for this image"[^>]*>', alt, body)


def export_html(input_dir: str | Path, output_dir: str | Path | None = None, *, strip_solutions: bool = False) -> Path:
    """Static HTML edition of the executed notebooks in ``input_dir`` in ``output_dir`` (default
    ``<input_dir>/html``): a page per executed ``NN_*.ipynb`` with contents / previous / next links; returns
    ``index.html``. With a warning each: a notebook without an executed cell is left out, a failed or stale
    (:func:`midas_nb.runs.run_state`) one marked. ``strip_solutions``: leave the cells tagged ``solution`` out (else
    each is a closed block). FileNotFoundError: no executed notebook."""
    from nbconvert import HTMLExporter
    input_dir = Path(input_dir)
    out = Path(output_dir) if output_dir is not None else input_dir / "html"
    paths = sorted(input_dir.glob(_NOTEBOOK_GLOB)) if input_dir.is_dir() else []
    run = run_state(input_dir)
    stale = {st.name: st.reason for st in run.notebooks if st.state == "stale"}
    pages: list[tuple[Path, Any, str, str]] = []
    for p in paths:
        nb = nbformat.read(str(p), as_version=4)
        code = [c for c in nb.cells if c.cell_type == "code"]
        if not any(c.get("execution_count") is not None or c.get("outputs") for c in code):
            warnings.warn(f"{p.name} has no executed code cell; left out of the HTML edition", stacklevel=2)
            continue
        failed = next((f"{o.get('ename', 'Error')}: {o.get('evalue', '')}".strip() for c in code
                       for o in c.get("outputs", []) if o.get("output_type") == "error"), "")   # the first error
        for mark, why in (("failed", failed and f"stopped with an error ({failed})"),
                          ("stale", p.name in stale and f"is stale ({stale[p.name]})")):
            if why:
                warnings.warn(f"{p.name} {why}; its page is marked as {mark} in the HTML edition", stacklevel=2)
        title = next((m.group(1) for c in nb.cells if c.cell_type == "markdown" for line in c.source.splitlines()
                      for m in [re.match(r"^\s{0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)] if m and m.group(1)), p.stem)
        pages.append((p, nb, title, failed))   # title: the first Markdown heading
    if not pages:
        source = input_dir.resolve() == (project_root() / "notebooks").resolve()
        raise FileNotFoundError(f"no executed notebook ({_NOTEBOOK_GLOB}) in {str(input_dir)!r}; " + (
            "it holds the source notebooks, which a run must not overwrite: run `midas-nb run --profile quick` "
            "and export its directory (runs/quick)" if source else f"run `midas-nb run --output {input_dir}` first"))
    out.mkdir(parents=True, exist_ok=True)
    exporter = _lab_exporter(HTMLExporter)
    links = [(p.stem + ".html", title) for p, _, title, _ in pages]
    header = _run_header(input_dir, run, pages, out)
    for i, (p, nb, title, _) in enumerate(pages):
        nb.cells = [nbformat.v4.new_markdown_cell(f"<details><summary>Reference solution (click to expand)</summary>\n"
                                                  f"<pre><code>{html.escape(c.source)}</code></pre>\n</details>")
                    if _is_solution(c) else c for c in nb.cells if not (strip_solutions and _is_solution(c))]
        body, _ = exporter.from_notebook_node(nb, resources={"metadata": {"name": title, "path": str(p.parent)}})
        prev, nxt = links[i - 1] if i > 0 else None, links[i + 1] if i + 1 < len(links) else None
        banner = (f'<div class="midas-stale-banner" style="background:#fff3cd;border:1px solid #e0b252;padding:.6em '
                  f'1em;margin:.5em 1em;font:14px system-ui,sans-serif"><strong>Stale:</strong> this page is not from '
                  f'the latest run — {html.escape(stale[p.name])}</div>' if p.name in stale else "")
        body = re.sub(r"(<body[^>]*>)", lambda m: m.group(1) + _NAV_CSS + _nav(prev, nxt, "top") + banner, body,
                      count=1)
        body = body.replace("</body>", _nav(prev, nxt, "bottom") + "</body>", 1)
        (out / links[i][0]).write_text(_alt_texts(nb, body), encoding="utf-8")
    items = "\n".join(f'  <li><a href="{href}">{html.escape(title)}</a> <small>({href[:-5]})</small>'
        + (f' <strong class="midas-failed">failed: {html.escape(failed)}</strong>' if failed else "")
        + (f' <strong class="midas-stale">stale: {html.escape(stale[p.name])}</strong>' if p.name in stale else "")
        + "</li>" for (href, title), (p, _, _, failed) in zip(links, pages))
    index = out / "index.html"
    index.write_text(
        '<!DOCTYPE html>\n<html lang="en"><head><meta charset="utf-8"><title>midas_nb — contents</title><style>'
        "body{font:16px/1.5 system-ui,sans-serif;max-width:52em;margin:2em auto;padding:0 1em}li{margin:.4em 0}"
        "</style></head>\n<body>\n<h1>midas_nb — part coverage versus faithfulness in token-pruning ViTs</h1>\n"
        f"{header}<p>Read the notebooks in order; each page links to the previous and next one.</p>\n"
        f'<ol class="midas-contents">\n{items}\n</ol>\n</body></html>\n', encoding="utf-8")
    return index
