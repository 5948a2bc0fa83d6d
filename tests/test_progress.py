"""Progress of batch runs: the library's loops in plain lines, papermill's cell bar and the cells' output
streamed, the kernel's TCP-encryption warning silenced (midas_nb.progress, midas_nb.cli.runner)."""
from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

from midas_nb import progress
from midas_nb.cli import runner as runs


@pytest.mark.parametrize("env, mode", [({}, "bar"), ({"TQDM_DISABLE": "1"}, "off"),
                                       ({"TQDM_DISABLE": "1", "MIDAS_PROGRESS": "lines"}, "lines"),
                                       ({"MIDAS_PROGRESS": "lines"}, "lines"), ({"TQDM_DISABLE": "0"}, "bar")])
def test_progress_mode_follows_the_environment(monkeypatch, env, mode):
    monkeypatch.delenv("TQDM_DISABLE", raising=False)
    monkeypatch.delenv("MIDAS_PROGRESS", raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert progress.progress_mode() == mode
    assert progress.progress_enabled(True) is (mode != "off")
    assert progress.progress_enabled(False) is False


def test_lines_mode_prints_whole_lines_with_the_epoch_and_postfix(monkeypatch, capsys):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.setenv("MIDAS_PROGRESS", "lines")
    monkeypatch.setenv("MIDAS_PROGRESS_INTERVAL", "0")
    bar = progress.tqdm(range(3), desc="distil hybrid_lite0_deit", unit="epoch")
    for i in bar:
        bar.set_postfix(loss=f"{1 / (i + 1):.3f}")
    out = capsys.readouterr().err        # the line writer uses stderr (the run drops it from executed copies)
    assert "\r" not in out and "|" not in out  # no carriage returns, no bar
    lines = out.splitlines()
    assert lines[0].startswith("distil hybrid_lite0_deit, epoch 0/3")
    assert lines[-1].startswith("distil hybrid_lite0_deit, epoch 3/3") and lines[-1].endswith("loss=0.333")


def test_a_training_line_shows_each_epoch_once_with_its_own_labelled_train_accuracy(monkeypatch, capsys):
    """A quick run's log repeated an epoch with another, unlabelled ``acc=``: tqdm's monitor redraws a bar while a
    long epoch runs, and the iterated bar still held the count of its last printed line beside a later epoch's
    values. The redraws are called here as the monitor calls them, twice an epoch; the lines are read back."""
    from tqdm.std import tqdm as std_tqdm

    from midas_nb.backbones.features import run_epochs

    monkeypatch.setenv(progress.PROGRESS_ENV, "lines")
    monkeypatch.setenv("MIDAS_PROGRESS_INTERVAL", "1000")   # no line of its own between the first and the last
    desc = "distil hybrid_lite0_deit, build 2"

    def epoch(e: int) -> dict[str, float]:
        for _ in range(2):
            for bar in [b for b in list(std_tqdm._instances) if b.desc == desc]:
                bar.refresh()
        return dict(loss=1 / (e + 1), train_running_accuracy=e / 10 if e != 3 else None)   # 4: MixToken's only

    history = run_epochs(5, desc, True, epoch)
    lines = [progress.PROGRESS_LINE.match(ln) for ln in capsys.readouterr().err.splitlines()]
    assert lines and all(lines) and {m["desc"] for m in lines} == {desc}   # every line names the build
    epochs = [int(m["n"]) for m in lines]
    assert epochs == sorted(set(epochs)) and epochs[-1] == 5    # each epoch once, in order, up to the last
    for m in lines[1:]:                                          # each with its own epoch's values, labelled
        row = history[int(m["n"]) - 1]
        acc = "all mixed" if row["epoch"] == 4 else f"{row['train_running_accuracy']:.3f}"
        assert m["postfix"] == f"loss={row['loss']:.3f}, train_acc={acc}"
    assert any(m["postfix"].endswith("train_acc=all mixed") for m in lines)
    seconds = [sum(int(x) * 60 ** i for i, x in enumerate(reversed(m["elapsed"].split(":")))) for m in lines]
    assert seconds == sorted(seconds)


def test_off_mode_and_disable_print_nothing(monkeypatch, capsys):
    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.delenv("MIDAS_PROGRESS", raising=False)
    assert list(progress.tqdm(range(3), desc="x")) == [0, 1, 2]
    monkeypatch.setenv("MIDAS_PROGRESS", "lines")
    assert list(progress.tqdm(range(3), desc="y", disable=True)) == [0, 1, 2]
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_study_streams_its_loops_only_when_the_run_asks(monkeypatch):
    """Study.progress was False under TQDM_DISABLE alone, so a streamed run showed nothing."""
    monkeypatch.setenv("TQDM_DISABLE", "1")
    monkeypatch.setenv("MIDAS_PROGRESS", "lines")
    from midas_nb.study import Study

    assert Study("smoke").progress is True
    assert Study("smoke", progress=False).progress is False
    monkeypatch.delenv("MIDAS_PROGRESS")
    assert Study("smoke").progress is False


def test_the_throughput_measurement_and_the_pruned_forwards_draw_their_bars(monkeypatch, capsys):
    """Notebook 04 sat silent for minutes "after block cache" (the throughput of every point's forwards) and 02
    "after protocol" (the pruned forwards of every ranking): each now has a bar, counted in its own steps."""
    from types import SimpleNamespace

    import torch

    from midas_nb.analysis import evaluation
    from midas_nb.metrics.speed import measure_throughputs

    monkeypatch.setenv("MIDAS_PROGRESS", "lines")
    monkeypatch.setenv("MIDAS_PROGRESS_INTERVAL", "0")
    rates = measure_throughputs({"full": lambda x: x + 1, "pruned": lambda x: x * 2}, torch.zeros(4, 3), repeats=2,
                                warmup=1, rounds=3, progress=True)
    assert set(rates) == {"full", "pruned"}
    assert capsys.readouterr().err.splitlines()[-1].startswith("throughput of 2 forwards, forward 8/8")   # 2 x (1 + 3)
    calls = []
    monkeypatch.setattr(evaluation, "prune_tokens", lambda bb, h, s, L, b: calls.append(h.shape[0]) or
                        SimpleNamespace(logits=torch.zeros(h.shape[0], 5), keep_mask=torch.zeros(h.shape[0], 4)))
    cache = type("C", (), {"hidden": torch.zeros(10, 5, 8), "__len__": lambda self: 10})()
    logits, masks = evaluation._pruned_eval(None, cache, [torch.zeros(10, 4)] * 3, 2, 0.5, 4, "cpu", progress=True)
    assert logits.shape == (3, 10, 5) and calls == [12, 12, 6]     # 3 rankings x image batches of 4, 4, 2
    assert capsys.readouterr().err.splitlines()[-1].startswith("pruned forward, 3 rankings at L=2, b=0.5, image batch 3/3")


def test_kernel_config_drops_only_the_tcp_warning_and_the_shutdown_interrupt_line():
    ns: dict = {}
    config = runs.kernel_arguments()[0].removeprefix("--config=")
    exec(Path(config).read_text(), ns)  # noqa: S102 - our own config file, as the kernel runs it
    log = logging.getLogger("IPKernelApp")
    seen = []
    handler = logging.Handler()
    handler.emit = lambda r: seen.append(r.getMessage())  # type: ignore[method-assign]
    log.addHandler(handler)
    try:
        log.warning("Kernel is running over TCP without encryption. All communication ...")
        log.error("KeyboardInterrupt caught in kernel.")   # jupyter_client's interrupt before shutdown
        log.warning("some other kernel warning")
        log.error("Exception in message handler:")
        try:   # a cell's reply sent after a stopped run closed the kernel's sockets: a 20-line traceback
            import zmq
            raise zmq.ZMQError(zmq.ENOTSOCK)
        except zmq.ZMQError:
            log.error("Exception in message handler:", exc_info=True)
    finally:
        log.removeHandler(handler)
        for f in list(log.filters):
            if type(f).__name__ == "_BatchRunNoise":
                log.removeFilter(f)
    assert seen == ["some other kernel warning", "Exception in message handler:"]


def test_a_killed_run_leaves_no_kernel_config_folder(tmp_path):
    """The config was written to a fresh ``midas_nb_kernel_*`` folder removed at exit: a killed
    run (no exit handlers) left one behind each time."""
    code = "import os, signal; from midas_nb.cli import runner; runner.kernel_arguments(); os.kill(os.getpid(), signal.SIGKILL)"
    env = dict(os.environ, TMPDIR=str(tmp_path), PYTHONPATH=str(Path(runs.__file__).parents[2]))
    assert subprocess.run([sys.executable, "-c", code], env=env).returncode == -signal.SIGKILL
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_kernel_started_with_the_run_arguments_prints_no_tcp_warning(tmp_path):
    def kernel_stderr(extra: list[str]) -> str:
        """The kernel's start-up output (its log and the note it prints once it listens)."""
        conn = tmp_path / f"k{len(extra)}.json"
        cmd = [sys.executable, "-m", "ipykernel_launcher", *extra, "-f", str(conn)]
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        lines: list[str] = []

        def read():
            for line in proc.stdout:
                lines.append(line)
                if "Ctrl-C will not work" in line:  # printed after the sockets (and the warning)
                    return

        reader = threading.Thread(target=read, daemon=True)
        reader.start()
        reader.join(timeout=120)  # a guard against a kernel that never starts, not a timing check
        proc.kill()
        proc.wait()
        assert any("Ctrl-C will not work" in ln for ln in lines), "".join(lines)
        return "".join(lines)

    assert "without encryption" in kernel_stderr([])  # the test can fail: the plain kernel prints it
    assert "without encryption" not in kernel_stderr(runs.kernel_arguments())


def _tiny_notebook(path):
    nb = new_notebook(cells=[new_markdown_cell("# tiny"),
                             new_code_cell("n = 2", metadata={"tags": ["parameters"]}),
                             new_code_cell("import os, time\nfrom midas_nb.progress import tqdm\n"
                                           "print('mode', os.environ.get('MIDAS_PROGRESS'))\n"
                                           "for _ in tqdm(range(2), desc='tiny loop', unit='epoch'):\n"
                                           "    time.sleep(0.5)")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(path))


@pytest.mark.slow
def test_execute_notebook_streams_the_cell_bar_and_the_loops_and_no_progress_streams_nothing(tmp_path, capfd,
                                                                                         monkeypatch):
    """The watcher of a run (a terminal or ``> log.txt 2>&1``) sees papermill's cell bar as whole lines and the
    cells' output with the library's loop lines as they come; the executed copy keeps the output, not the loop."""
    monkeypatch.delenv("MIDAS_PROGRESS", raising=False)
    monkeypatch.setenv("TQDM_DISABLE", "1")      # as midas-nb run sets it for the kernels: the cell bar still shows
    src = tmp_path / "07_tiny.ipynb"
    _tiny_notebook(src)
    runs.execute_notebook(src, tmp_path / "out.ipynb", parameters={"n": 3}, kernel_name="python3", cwd=str(tmp_path))
    cap = capfd.readouterr()
    bar = [ln for ln in cap.err.splitlines() if ln.startswith("07_tiny: ")]
    assert bar and bar[-1].startswith("07_tiny: 100%") and "4/4 [" in bar[-1], cap.err   # 3 cells + parameters
    assert "\r" not in cap.err and "mode lines" in cap.out
    assert "tiny loop, epoch 0/2" in cap.err and "tiny loop, epoch 2/2" in cap.err       # the library's loop lines
    assert "without encryption" not in cap.out + cap.err
    executed = nbformat.read(str(tmp_path / "out.ipynb"), as_version=4)
    kept = "".join(o.get("text", "") for o in executed.cells[-1].outputs)
    assert "mode lines" in kept and "tiny loop" not in kept

    runs.execute_notebook(src, tmp_path / "quiet.ipynb", parameters={"n": 3}, kernel_name="python3",
                          cwd=str(tmp_path), progress_bar=False)
    cap = capfd.readouterr()
    assert "07_tiny" not in cap.err and "mode" not in cap.out and "tiny loop" not in cap.err
    assert "without encryption" not in cap.out + cap.err
    executed = nbformat.read(str(tmp_path / "quiet.ipynb"), as_version=4)
    assert "mode None" in executed.cells[-1].outputs[0]["text"]


def _stop_a_sleeping_run(tmp_path, stop) -> tuple[int, str]:
    """``midas-nb run`` of a notebook whose cell sleeps 120 s, stopped by ``stop(proc)`` once the run streams
    the cell's output (it is running); the exit status and everything the run printed."""
    src = tmp_path / "nbs"
    src.mkdir()
    nb = new_notebook(cells=[new_code_cell("n = 2", metadata={"tags": ["parameters"]}),
                             new_code_cell("import time\nprint('sleeping', flush=True)\ntime.sleep(120)")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, str(src / "00_sleep.ipynb"))
    code = (f"from pathlib import Path; from midas_nb import cli; cli.runner.notebooks_dir = lambda: Path({str(src)!r}); "
            f"raise SystemExit(cli.main(['run', '--profile', 'smoke', '--output', {str(tmp_path / 'out')!r}]))")
    env = dict(os.environ, PYTHONPATH=str(Path(runs.__file__).parents[2]))
    proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env, start_new_session=True)
    said = []
    for line in proc.stdout:
        said.append(line)
        if "sleeping" in line:
            stop(proc)
            break
    said.append(proc.communicate(timeout=120)[0])
    return proc.returncode, "".join(said)


@pytest.mark.slow
def test_ctrl_c_mid_cell_prints_one_line_and_no_kernel_traceback(tmp_path):
    """Ctrl-C (SIGINT to the run's process group) while a cell runs: the kernel, shut down under
    its running cell, logged a 20-line traceback (a reply on a closed socket) before the run's line."""
    code, text = _stop_a_sleeping_run(tmp_path, lambda proc: os.killpg(proc.pid, signal.SIGINT))
    assert code == 130 and "Traceback" not in text and "Exception in message handler" not in text, text
    assert text.rstrip().splitlines()[-1].startswith("midas-nb run: interrupted; finished notebooks")


@pytest.mark.slow
def test_sigterm_mid_cell_is_one_line_and_keeps_no_unfinished_copy(tmp_path):
    """New-user finding (issue 54): ``kill`` (SIGTERM) of a run is a stop like Ctrl-C: one line, exit 130,
    "interrupted"; the notebook it stopped in leaves no copy beside the finished ones."""
    code, text = _stop_a_sleeping_run(tmp_path, lambda proc: proc.terminate())   # SIGTERM to the run only, as `kill PID`
    assert code == 130 and "Traceback" not in text, text
    assert text.rstrip().splitlines()[-1].startswith("midas-nb run: interrupted; finished notebooks")
    assert not (tmp_path / "out" / "00_sleep.ipynb").exists() and not (tmp_path / "out" / ".partial").exists()


def test_progress_lines_leave_the_executed_notebook_but_warnings_stay():
    from midas_nb.progress import PROGRESS_LINE
    from nbformat.v4 import new_output
    line = "train scorer, step 33/57 (00:10, 00:07 left), loss=0.704"
    assert PROGRESS_LINE.match(line) and not PROGRESS_LINE.match("UserWarning: the (left) hand side")
    # a two-word unit (02's insertion/deletion loop) stayed in the executed copy: a fresh reader saw a dozen
    two = "insertion/deletion, 17 rankings, image batch 1/2 (04:06, 04:06 left)"
    assert PROGRESS_LINE.match(two)["unit"] == "image batch"
    cell = new_code_cell("x", outputs=[
        new_output("stream", name="stderr", text=line + "\nprotocol, step 1/1 (00:28, 00:00 left)\n" + two + "\n"),
        new_output("stream", name="stderr", text="UserWarning: something real\n" + line + "\n"),
        new_output("stream", name="stdout", text=line + "\n")])        # stdout is the cell's own print
    nb = new_notebook(cells=[cell])
    assert runs.drop_progress_outputs(nb) == 4
    assert [o["text"] for o in nb.cells[0].outputs] == ["UserWarning: something real\n", line + "\n"]


def test_line_writer_goes_to_stderr_without_control_sequences(monkeypatch, capsys):
    monkeypatch.setenv(progress.PROGRESS_ENV, "lines")
    for _ in progress.tqdm(range(3), desc="demo"):
        pass
    err = capsys.readouterr().err
    assert "demo, step 3/3" in err and "\x1b" not in err
