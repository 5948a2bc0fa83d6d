"""Weights of the paper backbones in the layouts people have, loaded through the path the paper
run uses (``Study`` → ``load_or_finetune`` → ``create_backbone``), and a hub that cannot be
reached: an error within seconds that names the local-file alternative, never a hang."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from midas_nb import config
from midas_nb.backbones import (BackboneError, create_backbone, expected_weight_files, check_hub, num_blocks,
                                weights_for)

sys.path.insert(0, str(Path(__file__).resolve().parent))
from weight_files import (SMALL_KWARGS, paper_arch, write_augreg_npz, write_deit_release,  # noqa: E402
                          write_timm_pth, write_timm_safetensors)

REPO = Path(__file__).resolve().parents[1]
DEIT_S = "deit_small_patch16_224.fb_in1k"
AUGREG = "vit_base_patch16_224.augreg_in21k_ft_in1k"


def _body(sd):
    return {k: v for k, v in sd.items() if not k.startswith("head.")}


@pytest.mark.parametrize("name, writer, suffix", [
    ("deit_tiny_patch16_224.fb_in1k", write_deit_release, ".pth"),      # {"model": state_dict}
    (DEIT_S, write_timm_safetensors, ".safetensors"),                   # the timm hub file
    (DEIT_S, write_timm_pth, ".pth"),                                   # a plain timm state dict
    (AUGREG, write_augreg_npz, ".npz"),                                 # AugReg / big_vision release
])
def test_each_layout_loads_every_tensor_exactly(name, writer, suffix, tmp_path):
    kw = SMALL_KWARGS[name]
    src = paper_arch(name, seed=3, **kw)                       # 1000-class head, as the real files
    path = writer(src, tmp_path / f"w{suffix}")
    model = create_backbone(name, 7, weights=path, **kw)       # the run's classes: the head is replaced
    got, want = _body(model.state_dict()), _body(src.state_dict())
    assert set(got) == set(want)
    for k in want:
        assert torch.equal(got[k], want[k]), k
    assert tuple(model.head.weight.shape) == (7, kw["embed_dim"])
    # the same model class and a fixed input give the same features as the source model
    x = torch.randn(2, 3, 224, 224, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.allclose(model.forward_features(x), src.forward_features(x), atol=1e-5)


def test_weights_at_224_load_into_a_smaller_image_size(tmp_path):
    """Real files are trained at 224 px; the rehearsal runs at 64 px: the position table is resampled."""
    for name, writer in ((DEIT_S, write_deit_release), (AUGREG, write_augreg_npz)):
        src = paper_arch(name, **SMALL_KWARGS[name])
        path = writer(src, tmp_path / f"{name}{'.npz' if writer is write_augreg_npz else '.pth'}")
        model = create_backbone(name, 5, weights=path, img_size=64, **SMALL_KWARGS[name])
        assert tuple(model.pos_embed.shape) == (1, 1 + 16, SMALL_KWARGS[name]["embed_dim"])
        assert torch.equal(model.blocks[5].mlp.fc1.weight, src.blocks[5].mlp.fc1.weight)


def test_wrong_files_name_the_keys(tmp_path):
    wide = paper_arch(AUGREG, embed_dim=64, num_heads=4)
    npz = write_augreg_npz(wide, tmp_path / "wide.npz")
    with pytest.raises(BackboneError, match=r"199 shape mismatches: Transformer/encoder_norm/bias file \(64,\) vs model \(48,\)"):
        create_backbone(AUGREG, 5, weights=npz, **SMALL_KWARGS[AUGREG])
    arrays = dict(np.load(npz))
    del arrays["Transformer/encoderblock_7/MlpBlock_3/Dense_1/bias"]
    arrays["Transformer/encoderblock_12/LayerNorm_0/scale"] = np.ones(64, np.float32)
    np.savez(tmp_path / "edited.npz", **arrays)
    with pytest.raises(BackboneError) as e:
        create_backbone(AUGREG, 5, weights=tmp_path / "edited.npz", embed_dim=64, num_heads=4)
    assert "1 missing arrays: Transformer/encoderblock_7/MlpBlock_3/Dense_1/bias" in str(e.value)
    assert "1 unexpected arrays: Transformer/encoderblock_12/LayerNorm_0/scale" in str(e.value)
    st = write_timm_safetensors(paper_arch(DEIT_S, embed_dim=48, num_heads=2), tmp_path / "model.safetensors")
    with pytest.raises(BackboneError, match=r"150 shape mismatches: blocks.0.attn.proj.bias file \(48,\) vs model \(32,\)"):
        create_backbone(DEIT_S, 5, weights=st, **SMALL_KWARGS[DEIT_S])


class _RunsCode:
    def __reduce__(self):
        return (os.system, ("echo this file ran code",))


def test_a_file_that_pickles_code_is_refused_without_advice_to_load_it_unsafely(tmp_path):
    """torch's message says re-running with ``weights_only=False`` "will likely succeed": cut at 200
    characters, the refusal read as that advice. It names the pickled callable instead."""
    torch.save({"x": torch.zeros(1), "y": _RunsCode()}, tmp_path / "model.pth")
    with pytest.raises(BackboneError) as e:
        create_backbone("vit_smoke", 2, weights=tmp_path / "model.pth")
    assert "refused: it pickles posix.system, code that would run when loaded" in str(e.value)
    assert "weights_only" not in str(e.value) and "\n" not in str(e.value)


def test_study_passes_the_weights_file_of_its_backbone(tmp_path):
    """``-p weights FILE`` (a bare path) is the study's backbone's file; ``{name: file}`` per backbone."""
    prof = config.get_profile("rehearsal", weights=str(tmp_path / "deit_s.pth"))
    assert prof["weights"] == {DEIT_S: str(tmp_path / "deit_s.pth")}
    assert weights_for(prof, DEIT_S) == str(tmp_path / "deit_s.pth")
    assert weights_for(prof, AUGREG) == "hub"                                   # no file: timm's weights
    assert weights_for(config.get_profile("quick"), "hybrid_lite0_vit") is None  # built here, no hub weights
    assert num_blocks(AUGREG, **SMALL_KWARGS[AUGREG]) == 12


def test_expected_file_names():
    assert expected_weight_files(DEIT_S)[0].startswith("model.safetensors (from huggingface.co/timm/")
    assert "deit_small_patch16_224-cd65a155.pth" in expected_weight_files(DEIT_S)[1]
    assert expected_weight_files(AUGREG)[1].startswith("B_16-i21k-300ep-")
    assert expected_weight_files("hybrid_lite0_vit") == []


@pytest.fixture
def silent_server():
    """A TCP server that accepts connections and never answers (a hanging proxy or hub)."""
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    yield f"http://127.0.0.1:{s.getsockname()[1]}"
    s.close()


@pytest.mark.parametrize("endpoint", ["blackhole", "silent"])
def test_unreachable_hub_fails_within_seconds(endpoint, silent_server, monkeypatch, tmp_path):
    monkeypatch.setenv("HF_ENDPOINT", "http://10.255.255.1" if endpoint == "blackhole" else silent_server)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))          # an empty hub cache
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    t0 = time.time()
    with pytest.raises(BackboneError) as e:
        create_backbone(DEIT_S, 5, weights="hub")
    assert time.time() - t0 < 15
    msg = str(e.value)
    assert "cannot be reached" in msg and f"--weights {DEIT_S}=/path/to/model.safetensors" in msg
    assert "deit_small_patch16_224-cd65a155.pth" in msg
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    (line,) = check_hub(AUGREG)
    assert "HF_HUB_OFFLINE is set" in line


@pytest.mark.real_data
def test_paper_run_without_network_stops_in_seconds_naming_local_files(shared_data, silent_server, tmp_path):
    """Issue 14, case 3: ``midas-nb run --profile paper --device cpu --notebooks 00 --data-root CUB``
    on a machine without network: exit status 2 within seconds, naming ``--weights NAME=...``."""
    env = dict(os.environ, HF_ENDPOINT=silent_server, HF_HOME=str(tmp_path / "hf"),
               MIDAS_RUNS_DIR=str(tmp_path / "runs"), PYTHONPATH=str(REPO))
    env.pop("HF_HUB_OFFLINE", None)
    t0 = time.time()
    r = subprocess.run([sys.executable, "-m", "midas_nb.cli", "run", "--profile", "paper", "--device", "cpu",
                        "--notebooks", "00", "--data-root", str(shared_data / "cub200_subset"), "--no-progress"],
                       capture_output=True, text=True, env=env, timeout=180, cwd=str(tmp_path))
    took = time.time() - t0
    assert r.returncode == 2, r.stderr[-2000:]
    assert took < 90, f"took {took:.0f} s"
    assert f"--weights {DEIT_S}=/path/to/model.safetensors" in r.stderr
    assert "no notebook was started" in r.stderr
    assert not (tmp_path / "runs" / "paper").exists() or not list((tmp_path / "runs" / "paper").glob("*.ipynb"))
