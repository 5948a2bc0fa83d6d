"""The interactive path in a real browser: JupyterLab + headless Chromium driven by Selenium.

A JupyterLab server is started on localhost (token auth, a free port, fresh temporary Jupyter
config / runtime / settings / workspace directories, autosave off) over a temporary copy of
notebook ``00_quickstart`` — the notebook where a reader first meets the explorer. Headless
Debian Chromium (``/usr/bin/chromium`` + ``/usr/bin/chromedriver``) opens it, runs all cells in
the smoke profile with widgets on (``MIDAS_HEADLESS=0``), finds the explorer and changes its
controls: a target, depth ``L``, budget ``b`` and the image. After each change the rendered
figure must differ from the one before (pixel difference of two screenshots) and the text
read-out must show the kept-token count, the image's part IoU and IDAUC that this test computes
itself through ``midas_nb`` from the test split's cached target maps (another code path than
the explorer's own batch). Then a failing cell is added and run: its error must show in the page.

Screenshots are kept under ``runs/test/browser/`` (git-ignored). The tests skip, with the
reason, only where Chromium, chromedriver or Selenium is absent (``.ci/run`` installs them).

Showing that the test catches a broken explorer: with ``MIDAS_BROWSER_BREAK_EXPLORER=1`` the
harness gives the Jupyter kernel a temporary copy of ``midas_nb`` in which the explorer's
controls are no longer connected to its redraw callback (the shared code is never touched), and
``test_explorer_in_jupyterlab`` fails.
"""
from __future__ import annotations

import io
import json
import math
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
CHROMIUM = Path("/usr/bin/chromium")
CHROMEDRIVER = Path("/usr/bin/chromedriver")
ARTEFACTS = REPO / "runs" / "test" / "browser"
#: the notebook panel: the shell's current widget, or (JupyterLab 4.6 in a headless window, where no widget has
#: the focus and ``currentWidget`` stays null) the first widget of the main area
PANEL = "(window.jupyterapp.shell.currentWidget || Array.from(window.jupyterapp.shell.widgets('main'))[0])"
NOTEBOOK = "00_quickstart.ipynb"
#: the line of midas_nb/viz/widgets.py that connects the controls to the redraw (removed in break mode)
BREAK_ANCHOR = 'w.observe(draw, names="value")'
BREAK_ENV = "MIDAS_BROWSER_BREAK_EXPLORER"

try:
    import selenium  # noqa: F401
    HAVE_SELENIUM = True
except ImportError:  # pragma: no cover - the test extra installs it
    HAVE_SELENIUM = False

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (CHROMIUM.is_file() and CHROMEDRIVER.is_file()),
                       reason="headless Chromium not installed at /usr/bin/chromium and /usr/bin/chromedriver "
                              "(Debian packages chromium and chromium-driver; .ci/run installs them)"),
    pytest.mark.skipif(not HAVE_SELENIUM, reason="selenium is not installed (pip install -e '.[test]')"),
]

# JupyterLab user settings: no news / update pop-ups over the page, no autosave, every cell in the DOM
_SETTINGS = {
    "@jupyterlab/apputils-extension/notification.jupyterlab-settings":
        {"checkForUpdates": False, "fetchNews": "false"},
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
    "@jupyterlab/notebook-extension/tracker.jupyterlab-settings": {"windowingMode": "none"},
}


def _widgets_data_dir() -> str | None:
    """The Jupyter data folder holding the ipywidgets JupyterLab extension where the Jupyter paths miss it
    (a ``--system-site-packages`` venv: they follow the venv's prefix; docs/decisions/0065), else ``None``."""
    from jupyter_core.paths import jupyter_path

    from midas_nb.course.publish import jupyter_data_dir

    found = jupyter_data_dir("jupyterlab_widgets", "labextensions/@jupyter-widgets/jupyterlab-manager/package.json")
    seen = {str(Path(p).resolve()) for p in jupyter_path()}
    return str(found) if found is not None and str(found) not in seen else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _broken_package(tmp: Path) -> Path:
    """A copy of midas_nb whose explorer controls no longer trigger the redraw callback."""
    dst = tmp / "broken_pkg"
    shutil.copytree(REPO / "midas_nb", dst / "midas_nb", ignore=shutil.ignore_patterns("__pycache__"))
    w = dst / "midas_nb" / "viz" / "widgets.py"
    src = w.read_text()
    assert src.count(BREAK_ANCHOR) == 1, f"break mode: {BREAK_ANCHOR!r} not found once in widgets.py"
    w.write_text(src.replace(BREAK_ANCHOR, "pass  # disconnected by tests/test_browser.py break mode"))
    return dst


class Lab:
    """A JupyterLab server over a temporary directory and a Selenium-driven headless Chromium."""

    def __init__(self, tmp: Path, broken: bool):
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service

        self.tmp = tmp
        root = tmp / "root"
        root.mkdir()
        shutil.copy(REPO / "notebooks" / NOTEBOOK, root / NOTEBOOK)
        settings = tmp / "lab-settings"
        for rel, value in _SETTINGS.items():
            p = settings / rel
            p.parent.mkdir(parents=True, exist_ok=True)
            p.write_text(json.dumps(value))
        env = dict(os.environ)
        env.pop("MPLBACKEND", None)  # the kernel keeps Jupyter's inline backend
        pkg = _broken_package(tmp) if broken else REPO
        env.update(
            JUPYTER_CONFIG_DIR=str(tmp / "jupyter-config"), JUPYTER_RUNTIME_DIR=str(tmp / "jupyter-runtime"),
            JUPYTERLAB_SETTINGS_DIR=str(settings), JUPYTERLAB_WORKSPACES_DIR=str(tmp / "lab-workspaces"),
            IPYTHONDIR=str(tmp / "ipython"), MIDAS_PROFILE="smoke", MIDAS_HEADLESS="0",
            MIDAS_FIGURES_DIR=str(ARTEFACTS / "figures"),
            PYTHONPATH=os.pathsep.join([str(pkg), env.get("PYTHONPATH", "")]).rstrip(os.pathsep))
        widgets = _widgets_data_dir()
        if widgets is not None:   # a venv reusing another environment's packages: its paths miss the extension
            env["JUPYTER_PATH"] = os.pathsep.join(p for p in (widgets, env.get("JUPYTER_PATH", "")) if p)
        if broken:  # the kernel must import the broken copy, not the editable install
            where = subprocess.run([sys.executable, "-c", "import midas_nb; print(midas_nb.__file__)"],
                                   env=env, cwd=root, capture_output=True, text=True, check=True).stdout.strip()
            assert where.startswith(str(pkg)), f"break mode: the kernel would import {where}"
        self.port, self.token = _free_port(), os.urandom(16).hex()
        self.log = open(tmp / "jupyterlab.log", "w")
        cmd = [sys.executable, "-m", "jupyterlab", "--no-browser", "--ServerApp.open_browser=False",
               "--ServerApp.ip=127.0.0.1", f"--ServerApp.port={self.port}", "--ServerApp.port_retries=0",
               f"--IdentityProvider.token={self.token}", f"--ServerApp.root_dir={root}",
               "--LabApp.expose_app_in_browser=True", "--ServerApp.allow_root=True"]
        self.server = subprocess.Popen(cmd, env=env, stdout=self.log, stderr=subprocess.STDOUT,
                                       start_new_session=True)
        self.driver = None
        try:
            self._wait_for_server(60)
            opts = webdriver.ChromeOptions()
            opts.binary_location = str(CHROMIUM)
            for a in ("--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                      "--disable-background-networking", "--disable-component-update", "--disable-sync",
                      "--disable-dev-shm-usage", f"--user-data-dir={tmp / 'chromium-profile'}",
                      "--window-size=1400,1100"):
                opts.add_argument(a)
            self.driver = webdriver.Chrome(service=Service(str(CHROMEDRIVER)), options=opts)
            self.driver.set_script_timeout(60)
        except BaseException:
            self.close()
            raise

    def url(self, path: str) -> str:
        return f"http://127.0.0.1:{self.port}{path}?token={self.token}"

    def _wait_for_server(self, timeout: float) -> None:
        t0 = time.time()
        while time.time() - t0 < timeout:
            if self.server.poll() is not None:
                raise RuntimeError(f"JupyterLab exited ({self.server.returncode}): {self.server_log()[-3000:]}")
            try:
                with urllib.request.urlopen(self.url("/api/status"), timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                time.sleep(0.5)
        raise TimeoutError(f"JupyterLab did not answer within {timeout} s: {self.server_log()[-3000:]}")

    def server_log(self) -> str:
        self.log.flush()
        return (self.tmp / "jupyterlab.log").read_text(errors="replace")

    def js(self, script: str, *args):
        return self.driver.execute_script(script, *args)

    def wait(self, what: str, fn, timeout: float = 120.0, poll: float = 0.25):
        """``fn()`` until truthy; on timeout a screenshot is saved and the error names ``what``."""
        t0, last = time.time(), None
        while time.time() - t0 < timeout:
            try:
                last = fn()
            except Exception as e:  # noqa: BLE001 - the page is still building
                last = e
            else:
                if last:
                    return last
            time.sleep(poll)
        self.shot(f"timeout_{re.sub(r'[^a-z0-9]+', '_', what.lower())[:40]}")
        raise TimeoutError(f"waited {timeout:.0f} s for {what}; last value {last!r}")

    def kernel_idle(self) -> bool:
        return bool(self.js(
            f"const w = window.jupyterapp && {PANEL};"
            "const k = w && w.sessionContext && w.sessionContext.session && w.sessionContext.session.kernel;"
            "const busy = Array.from(document.querySelectorAll('.jp-InputPrompt')).some("
            "  p => p.textContent.includes('*'));"
            "return !!k && k.status === 'idle' && !busy;"))

    def command(self, name: str) -> None:
        self.js(f"window.jupyterapp.commands.execute({json.dumps(name)});")

    def shot(self, name: str, element=None) -> Path:
        ARTEFACTS.mkdir(parents=True, exist_ok=True)
        path = ARTEFACTS / f"{name}.png"
        (element.screenshot(str(path)) if element is not None else self.driver.save_screenshot(str(path)))
        return path

    def close(self) -> None:
        if self.driver is not None:
            try:
                self.driver.quit()
            except Exception:  # noqa: BLE001
                pass
        if self.server.poll() is None:
            try:  # shuts the kernels down too
                req = urllib.request.Request(self.url("/api/shutdown"), method="POST")
                urllib.request.urlopen(req, timeout=10).close()
                self.server.wait(timeout=20)
            except Exception:  # noqa: BLE001
                pass
        if self.server.poll() is None:
            os.killpg(self.server.pid, signal.SIGTERM)
            try:
                self.server.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(self.server.pid, signal.SIGKILL)
        self.log.close()


@pytest.fixture(scope="module")
def lab(tmp_path_factory):
    """JupyterLab with notebook 00 open and all of its cells run in the smoke profile."""
    if ARTEFACTS.exists():
        shutil.rmtree(ARTEFACTS)
    broken = os.environ.get(BREAK_ENV, "") not in ("", "0")
    lab = Lab(tmp_path_factory.mktemp("lab"), broken=broken)
    try:
        lab.driver.get(lab.url(f"/lab/tree/{NOTEBOOK}"))
        lab.wait("the notebook to open", lambda: lab.js(
            f"const w = window.jupyterapp && {PANEL}; if (w) window.jupyterapp.shell.activateById(w.id);"
            "return !!(w && w.content && w.content.widgets.length > 3);"), timeout=120)
        lab.wait("the kernel to start", lab.kernel_idle, timeout=120)
        lab.command("notebook:run-all-cells")
        lab.wait("the explorer's read-out", lambda: lab.js(
            "const r = document.querySelector('.midas-explorer .midas-explorer-readout');"
            "return r && r.innerText.includes('kept') ? r.innerText : null;"), timeout=300)
        lab.wait("all cells to finish", lab.kernel_idle, timeout=300)
        lab.shot("00_after_run_all")
        yield lab
    finally:
        lab.close()


# ------------------------------------------------------------------------------------------
# the explorer
# ------------------------------------------------------------------------------------------
_LINE = re.compile(r"^(\S+): kept (\d+)/(\d+) patch tokens · (part|box) IoU (n/a|[\d.]+)\S* .*?IDAUC ([+-][\d.]+)")
_HEAD = re.compile(r"test index (\d+),.*depth L=(\d+) · budget b=(\d+)%")


def _readout(lab: Lab) -> str:
    return lab.js("const r = document.querySelector('.midas-explorer .midas-explorer-readout');"
                  "return r ? r.innerText : '';")


def _parse(text: str) -> dict:
    head = _HEAD.search(text)
    assert head, f"read-out without its header: {text!r}"
    lines = [m.groups() for m in (_LINE.match(s.strip()) for s in text.splitlines()) if m]
    assert len(lines) == 2, f"read-out should have one line per target: {text!r}"
    return dict(index=int(head.group(1)), depth=int(head.group(2)), budget_pct=int(head.group(3)),
                rows=[dict(target=t, kept=int(k), n=int(n), iou=None if v == "n/a" else float(v), idauc=float(d))
                      for t, k, n, _, v, d in lines])


@pytest.fixture(scope="module")
def study():
    from midas_nb.study import Study
    return Study("smoke", progress=False)


def _expected(study, index: int, depth: int, budget: float, targets: list[str]) -> list[dict]:
    """Kept tokens, part IoU and IDAUC of test image ``index`` computed here, from the test
    split's cached target maps (not the explorer's own batch)."""
    import torch

    from midas_nb import metrics
    from midas_nb.viz import widgets

    maps = study.target_maps(depth=depth, ids=targets)
    sample = study.test_set[index]
    N = study.grid[0] * study.grid[1]
    out = []
    for t in targets:
        ranking = maps[t][index:index + 1].float()
        keep = widgets.kept_mask(ranking, budget)
        iou = metrics.part_miou(keep, sample.part_mask[None]).per_image[0]
        r = metrics.insertion_deletion_auc(study.model, sample.image[None], ranking,
                                           steps=study.settings.protocol.idauc_steps)
        out.append(dict(target=t, kept=math.ceil(round(budget * N, 9)), n=N,
                        iou=None if torch.isnan(iou) else round(float(iou), 3), idauc=float(r.idauc[0])))
    return out


def _check(lab: Lab, study, text: str, targets: list[str], depth: int, budget_pct: int, name: str) -> dict:
    got = _parse(text)
    assert (got["depth"], got["budget_pct"]) == (depth, budget_pct), text
    assert [r["target"] for r in got["rows"]] == targets, text
    exp = _expected(study, got["index"], depth, budget_pct / 100, targets)
    for g, e in zip(got["rows"], exp):
        assert (g["kept"], g["n"]) == (e["kept"], e["n"]), (name, g, e)
        assert g["iou"] == e["iou"], (name, g, e)
        assert abs(g["idauc"] - e["idauc"]) <= 1.5e-3, (name, g, e)
    return got


def _figure_png(lab: Lab, name: str) -> bytes:
    el = lab.driver.find_element("css selector", ".midas-explorer .midas-explorer-figure")
    lab.wait("the figure to load", lambda: lab.js("return arguments[0].complete && arguments[0].naturalWidth > 0;", el),
             timeout=30)
    return lab.shot(name, el).read_bytes()


def _pixel_difference(a: bytes, b: bytes) -> float:
    """Fraction of pixels that differ between two screenshots (1.0 when the sizes differ)."""
    import numpy as np
    from PIL import Image
    x = np.asarray(Image.open(io.BytesIO(a)).convert("RGB"), dtype=np.int16)
    y = np.asarray(Image.open(io.BytesIO(b)).convert("RGB"), dtype=np.int16)
    if x.shape != y.shape:
        return 1.0
    return float((np.abs(x - y).max(axis=2) > 16).mean())


def _control(lab: Lab, label: str):
    xpath = (f"//div[contains(@class,'midas-explorer')]//div[contains(@class,'widget-inline-hbox')]"
             f"[./label[normalize-space()='{label}']]")
    return lab.driver.find_element("xpath", xpath)


def _after(lab: Lab, before: str, what: str, want: tuple[int, int]) -> str:
    """The read-out once it changed and shows depth and budget ``want``: a slider moved by several
    key presses redraws after each, so the first change may be an intermediate value."""
    def ready():
        t = _readout(lab)
        head = _HEAD.search(t or "")
        return t if t and t != before and head and (int(head.group(2)), int(head.group(3))) == want else None
    lab.wait(f"the read-out to change after {what}", ready, timeout=90)
    lab.wait(f"the kernel after {what}", lab.kernel_idle, timeout=90)
    return _readout(lab)


def test_explorer_in_jupyterlab(lab, study):
    from selenium.webdriver.common.keys import Keys
    from selenium.webdriver.support.ui import Select

    text = _readout(lab)
    state = dict(targets=["T0", "T5"], depth=study.settings.point.depth, budget=round(100 * study.settings.point.budget))
    _check(lab, study, text, state["targets"], state["depth"], state["budget"], "initial")
    png = _figure_png(lab, "01_explorer_initial")
    lab.js("document.querySelector('.midas-explorer').scrollIntoView({block: 'start'});")
    lab.shot("01_page_initial")

    steps = []

    def right_target():
        Select(_control(lab, "right target").find_element("tag name", "select")).select_by_visible_text("T3")
        state["targets"] = ["T0", "T3"]

    def depth():
        _control(lab, "depth L").find_element("css selector", ".noUi-handle").send_keys(Keys.ARROW_LEFT)
        state["depth"] -= 1

    def budget():
        handle = _control(lab, "budget b").find_element("css selector", ".noUi-handle")
        for _ in range(3):  # 25 % → 40 %: k = ceil(0.4·64) = 26, no float tie at an integer
            handle.send_keys(Keys.ARROW_RIGHT)
        state["budget"] += 15

    def image():
        Select(_control(lab, "image").find_element("tag name", "select")).select_by_index(3)

    for i, (what, act) in enumerate([("target", right_target), ("depth", depth), ("budget", budget),
                                      ("image", image)], start=2):
        before = text
        act()
        text = _after(lab, before, what, (state["depth"], state["budget"]))
        got = _check(lab, study, text, state["targets"], state["depth"], state["budget"], what)
        new = _figure_png(lab, f"{i:02d}_explorer_after_{what}")
        diff = _pixel_difference(png, new)
        steps.append((what, diff, got))
        assert diff > 0.005, f"the explorer's figure did not change after the {what} change ({diff:.2%} pixels)"
        png = new
    assert steps[-1][2]["index"] != steps[-2][2]["index"], "the image menu did not change the image"
    lab.shot("06_page_after_changes")
    errors = lab.js("return document.querySelectorAll('.midas-explorer-error').length;")
    assert errors == 0, _readout(lab)


def test_failing_cell_shows_its_error(lab):
    lab.js(f"const nb = {PANEL}.content;"
           "nb.activeCellIndex = nb.widgets.length - 1;")
    lab.js("window.jupyterapp.commands.execute('notebook:insert-cell-below');")
    lab.wait("the new cell", lambda: lab.js(
        f"const c = {PANEL}.content.activeCell;"
        "return c && c.model.sharedModel.getSource() === '';"), timeout=30)
    lab.js(f"{PANEL}.content.activeCell.model.sharedModel.setSource("
           "\"raise ValueError('browser check: this cell fails on purpose')\");")
    lab.command("notebook:run-cell")
    shown = lab.wait("the error in the page", lambda: lab.js(
        "const o = Array.from(document.querySelectorAll('.jp-OutputArea-output[data-mime-type=\"application/vnd.jupyter.stderr\"]'));"
        "const t = o.map(e => e.innerText).join('\\n');"
        "return t.includes('browser check: this cell fails on purpose') ? t : null;"), timeout=60)
    assert "ValueError" in shown
    lab.driver.execute_script("arguments[0].scrollIntoView({block: 'center'});", lab.driver.find_elements(
        "css selector", ".jp-OutputArea-output[data-mime-type='application/vnd.jupyter.stderr']")[-1])
    lab.shot("07_failing_cell")
