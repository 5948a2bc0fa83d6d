"""Is the package ready for the GPU paper run? One short script, four parts.

(a) **Agreement**: on one fixed batch, the capture (attention, hidden states and their
    gradients at block L), the supervision targets T0–T5, the pruned forward (``st`` and
    ``soft`` relaxations), insertion/deletion AUC and one scorer training step run on the
    device with mixed precision (autocast; bfloat16 where supported) and on the CPU in
    float32; every quantity is compared (cosine of maps, max |Δ| of probabilities and AUCs,
    top-1 agreement, relative change of the updated scorer weights). A line per check ends in
    ``ok`` or ``MISMATCH``.
(b) **Projection**: the components of one protocol cell of DeiT-S/16 at paper sizes
    (224 px, 384 wide, 12 blocks, L = 6, b = 25 %, batch 128, S = 20 IDAUC steps) are timed on
    the device — block-L cache and target capture over the train split (once per dataset),
    scorer training (10 epochs), evaluation (pruned forward, IDAUC) over the test split — and
    one real cell (:func:`midas_nb.analysis.protocol.run_protocol`, a small synthetic set) runs end to
    end. The script prints the projected hours of the paper table: 3 datasets (CUB-200-2011
    5,994 / 5,794, FGVC-Aircraft trainval 6,667 / test 3,333, Stanford Cars 8,144 / 8,041
    images) × 7 conditions × 3 seeds (the reference once) at L = 6, b = 25 %, plus the three
    backbone fine-tunes (30 epochs). Goal: ≤ 2 h on one H200; last line
    ``ratio: <projected hours / 2>``.
(c) **Whole profile**: the same per-image timings priced over every cell of every notebook sweep
    of the ``paper`` profile (:func:`midas_nb.study.cluster.profile_sweeps`: 02 protocol, soft,
    random; 04 regime 3 datasets × 3 backbones × 16 (L, b); 05 scale and backbones; 06 related)
    and written as the cost table ``midas-nb sweep plan`` reads before the shipped one (``--cost-out``;
    by default ``runs/bench/cell_cost.json`` on a CUDA device only; decision 0068). Scaling: DeiT-Ti/S/B from the measured
    model by the FLOPs of a block (``12·N·d² + 2·N²·d``); the scorer's training step by the tokens
    its blocks after L see (``(depth − L)·(⌈bN⌉ + 1)``) against the measured L = 6, b = 25 %; the
    block-L cache by L / 6, the evaluation by S = 20 over the measured S. Sharing, as the runner does it: the block-L states and the target
    maps are computed once per (dataset, backbone, L) and cached on disk for every condition,
    seed and budget at that L; blocks 1..L are *not* shared between depths (each L recomputes
    them from the image), and the projection assumes no such sharing. Every cell is then scaled by
    the measured / projected time of a real cell that finds its caches (the last part), so the
    table prices what a sweep's cells really cost on the device, loading and Python included.
(d) **Real cells**: two :func:`~midas_nb.analysis.protocol.run_protocol` cells (T5, synthetic
    images, the paper profile's precision) with empty caches and then with cached block-L states
    and targets, each beside its projection from part (b).

    python bench/gpu_check.py --device cuda            # the real check (needs a CUDA GPU)
    python bench/gpu_check.py --device cpu --small     # CI: tiny model, same code path

Random weights are used (the numbers being compared do not depend on pretraining); pass
``--weights FILE`` to check a real DeiT-S file. Exit status 1 when a check mismatches.
"""
from __future__ import annotations

import argparse
import contextlib
import math
import sys
import tempfile
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run from a checkout without installing

from midas_nb.backbones import create_backbone  # noqa: E402
from midas_nb.config import get_profile, PROFILES  # noqa: E402
from midas_nb.capture import capture  # noqa: E402
from midas_nb.metrics import insertion_deletion_auc  # noqa: E402
from midas_nb.scorers import MLPScorer  # noqa: E402
from midas_nb.targets import get_target  # noqa: E402
from midas_nb.train import distill_loss, relaxed_logits  # noqa: E402
from midas_nb.backbones.vit import embed_tokens, num_prefix_tokens, run_blocks  # noqa: E402

BACKBONE = "deit_small_patch16_224.fb_in1k"
#: (train, test) images of the paper's datasets (Aircraft: trainval / test)
PAPER_SPLITS = {"cub": (5994, 5794), "aircraft": (6667, 3333), "cars": (8144, 8041)}
CONDITIONS = 7          # reference, unsupervised, T1..T5
TRAINED = 6             # every condition but the reference trains a scorer
SEEDS = 3
GOAL_HOURS = 2.0
GOAL_PROFILE_HOURS = 4.0   # the whole paper profile, every notebook's cells and the 9 fine-tunes


def _autocast(device: torch.device):
    if device.type == "cuda":
        dtype = torch.bfloat16 if torch.cuda.is_bf16_supported() else torch.float16
    else:
        dtype = torch.bfloat16
    return lambda: torch.autocast(device_type=device.type, dtype=dtype), str(dtype).replace("torch.", "")


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _cos(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().float().cpu().flatten(1), b.detach().float().cpu().flatten(1)
    return float(F.cosine_similarity(a, b, dim=1, eps=1e-12).min())


class Checks:
    def __init__(self) -> None:
        self.failed = 0

    def report(self, name: str, value: float, ok: bool, what: str) -> None:
        self.failed += int(not ok)
        print(f"  {name:<34} {what} = {value:.4g}  {'ok' if ok else 'MISMATCH'}", flush=True)


def agreement(args, device: torch.device, kw: dict) -> int:
    """Part (a); returns the number of mismatches."""
    torch.manual_seed(0)
    ref = create_backbone(BACKBONE, 10, weights=args.weights, **kw).float().eval()
    dev = create_backbone(BACKBONE, 10, weights=args.weights, **kw).eval()
    dev.load_state_dict(ref.state_dict())
    dev = dev.to(device)
    size = ref.patch_embed.img_size
    g = torch.Generator().manual_seed(1)
    images = torch.randn(args.batch, 3, *size, generator=g)
    labels = torch.randint(0, 10, (args.batch,), generator=g)
    amp, precision = _autocast(device)
    L, b = args.depth, 0.25
    chk = Checks()
    print(f"(a) {device} with autocast {precision} against cpu float32, batch {args.batch}, "
          f"{size[0]} px, L={L}, b={b}:")

    # capture: attention, hidden state and their gradients at block L
    cap_ref = capture(ref, images, labels, labels)
    with amp():
        cap_dev = capture(dev, images.to(device), labels.to(device), labels.to(device))
    i = L - 1
    for name, x, y in (("attention A (block L)", cap_ref.attn[i], cap_dev.attn[i]),
                       ("hidden h (block L)", cap_ref.hidden[i], cap_dev.hidden[i]),
                       ("dy_c/dA (block L)", cap_ref.attn_grad[i], cap_dev.attn_grad[i]),
                       ("dy_c/dh (block L)", cap_ref.hidden_grad[i], cap_dev.hidden_grad[i])):
        c = _cos(x, y)
        chk.report(f"capture {name}", c, c >= args.cos_min, "min cosine over images")
    # targets T0..T5 at block L
    cls = labels
    for t in ("T0", "T1", "T2", "T3", "T4", "T5"):
        a = get_target(t)(cap_ref, L, cls)
        bmap = get_target(t)(cap_dev.to("cpu"), L, cls)
        c = _cos(a, bmap)
        chk.report(f"target {t}", c, c >= args.cos_min, "min cosine over images")
    # pruned forward, st and soft, with an MLP scorer
    torch.manual_seed(2)
    scorer_ref = MLPScorer(ref.embed_dim)
    scorer_dev = MLPScorer(ref.embed_dim).to(device)
    scorer_dev.load_state_dict(scorer_ref.state_dict())
    P = num_prefix_tokens(ref)
    with torch.no_grad():
        h_ref = run_blocks(ref, embed_tokens(ref, images), 0, L)
        with amp():
            h_dev = run_blocks(dev, embed_tokens(dev, images.to(device)), 0, L)
    for relax in ("st", "soft"):
        with torch.no_grad():
            p_ref = relaxed_logits(ref, h_ref, scorer_ref(h_ref, P), L, b, relax).softmax(-1)
            with amp():
                p_dev = relaxed_logits(dev, h_dev, scorer_dev(h_dev, P), L, b, relax).float().softmax(-1).cpu()
        d = float((p_ref - p_dev).abs().max())
        chk.report(f"pruned forward ({relax}) softmax", d, d <= args.prob_tol, "max |dp|")
        agree = float((p_ref.argmax(-1) == p_dev.argmax(-1)).float().mean())
        chk.report(f"pruned forward ({relax}) top-1", agree, agree >= 0.75, "agreement")
    # insertion / deletion AUC along T5
    rank = get_target("T5")(cap_ref, L, cls)
    ins_ref = insertion_deletion_auc(ref, images, rank, steps=args.steps, device="cpu")
    with amp():
        ins_dev = insertion_deletion_auc(dev, images.to(device), rank.to(device), steps=args.steps, device=device)
    d = float((ins_ref.idauc.cpu() - ins_dev.idauc.float().cpu()).abs().max())
    chk.report("IDAUC (T5 ranking)", d, d <= args.auc_tol, "max |dIDAUC|")
    # one scorer training step: L_cls through the st relaxation + lambda * L_ga(T5)
    target = get_target("T5")(cap_ref, L, cls)
    moved = []
    for model, scorer, h, dv in ((ref, scorer_ref, h_ref, torch.device("cpu")), (dev, scorer_dev, h_dev, device)):
        opt = torch.optim.AdamW(scorer.parameters(), lr=1e-3)
        before = {k: v.detach().clone() for k, v in scorer.state_dict().items()}
        ctx = amp if dv.type == device.type and model is dev else contextlib.nullcontext
        with ctx():
            s = scorer(h.detach().float() if model is ref else h.detach(), P)
            loss = F.cross_entropy(relaxed_logits(model, h.detach(), s, L, b, "st").float(), labels.to(dv)) \
                + distill_loss(s.float(), target.to(dv))
        opt.zero_grad()
        loss.backward()
        opt.step()
        moved.append({k: (scorer.state_dict()[k] - before[k]).float().cpu() for k in before})
    c = min(float(F.cosine_similarity(moved[0][k].flatten(), moved[1][k].flatten(), dim=0, eps=1e-12))
            for k in moved[0] if moved[0][k].abs().sum() > 0)
    chk.report("scorer step: weight update", c, c >= args.cos_min_step, "min cosine over tensors")
    return chk.failed


def _time(fn, device: torch.device, repeats: int) -> float:
    fn()  # warm-up (kernels, caches)
    _sync(device)
    t = time.perf_counter()
    for _ in range(repeats):
        fn()
    _sync(device)
    return (time.perf_counter() - t) / repeats


def projection(args, device: torch.device, kw: dict) -> float:
    """Part (b); returns the projected hours of the paper table (plus fine-tunes)."""
    torch.manual_seed(0)
    model = create_backbone(BACKBONE, 200, weights=args.weights, device=device, **kw).eval()
    amp, precision = _autocast(device)
    B, L, b, S = args.time_batch, args.depth, 0.25, args.steps
    size = model.patch_embed.img_size
    images = torch.randn(B, 3, *size, device=device)
    labels = torch.randint(0, 200, (B,), device=device)
    P = num_prefix_tokens(model)
    scorer = MLPScorer(model.embed_dim).to(device)
    opt = torch.optim.AdamW(scorer.parameters(), lr=1e-3)
    with torch.no_grad(), amp():
        h = run_blocks(model, embed_tokens(model, images), 0, L)
    target = torch.randn(B, h.shape[1] - P, device=device)

    # as the paper profile's protocol computes (precision "bfloat16", protocol_autocast): block-L
    # states, targets, scores and the kept tokens in float32; training and insertion/deletion under autocast
    def block_cache():
        with torch.no_grad():
            run_blocks(model, embed_tokens(model, images), 0, L)

    def targets():
        capture(model, images, labels, labels)

    def train_step():
        with amp():
            s = scorer(h, P)
            loss = F.cross_entropy(relaxed_logits(model, h, s, L, b, "st").float(), labels) + distill_loss(s.float(), target)
        opt.zero_grad()
        loss.backward()
        opt.step()

    def evaluate():
        with torch.no_grad():
            s = scorer(h.float(), P)
            relaxed_logits(model, h.float(), s, L, b, "st")
            with amp():
                insertion_deletion_auc(model, images, s.float(), steps=S, device=device)

    ft = create_backbone(BACKBONE, 200, weights=args.weights, device=device, **kw).train()
    ft_opt = torch.optim.AdamW(ft.parameters(), lr=1e-4)

    def finetune_step():
        with amp():
            loss = F.cross_entropy(ft(images).float(), labels)
        ft_opt.zero_grad()
        loss.backward()
        ft_opt.step()

    r = args.repeats
    per = args.per = {name: _time(fn, device, r) / B for name, fn in
           (("block cache", block_cache), ("targets", targets), ("train", train_step), ("evaluate", evaluate),
            ("finetune", finetune_step))}
    print(f"\n(b) {device}, training and insertion/deletion under autocast {precision} (the paper profile's "
          f"precision), the rest float32, {size[0]} px, width {model.embed_dim}, "
          f"{len(model.blocks)} blocks, batch {B}: ms per image")
    for k, v in per.items():
        print(f"  {k:<12} {1e3 * v:8.3f}")
    table_s = finetune_s = 0.0
    for ds, (n_train, n_test) in PAPER_SPLITS.items():
        once = n_train * (per["block cache"] + per["targets"])
        cells = TRAINED * SEEDS * (args.epochs * n_train * per["train"] + n_test * per["evaluate"]) \
            + n_test * per["evaluate"]                                   # the reference: once
        table_s += once + cells
        finetune_s += args.finetune_epochs * n_train * per["finetune"]
        print(f"  {ds:<9} {n_train:>5} train / {n_test:>5} test: table {((once + cells) / 3600):.2f} h")
    print(f"projected paper table (3 datasets x {CONDITIONS} conditions x {SEEDS} seeds, L={L}, b={b:g}, "
          f"{args.epochs} scorer epochs, S={S}): {table_s / 3600:.2f} h on this device")
    print(f"projected DeiT-S fine-tunes ({args.finetune_epochs} epochs, 3 datasets): {finetune_s / 3600:.2f} h")
    args.model = model
    return table_s / 3600


def _block_flops(d: int, n: int) -> float:
    """Multiply-adds of one ViT block on ``n`` tokens of width ``d`` (QKV, projection, MLP 4d; attention)."""
    return 12 * n * d * d + 2 * n * n * d


#: embedding widths of the paper's backbones (12 blocks, 197 tokens at 224 px)
PAPER_WIDTHS = {"deit_tiny_patch16_224.fb_in1k": 192, "deit_small_patch16_224.fb_in1k": 384,
                "vit_base_patch16_224.augreg_in21k_ft_in1k": 768}
_UNTRAINED = ("reference", "random")
PAPER_STEPS = 20        # IDAUC steps S of the paper profile


def profile_projection(per: dict, model, args, calibration: float = 1.0) -> dict:
    """Part (c): the paper profile's every cell priced from ``per`` (seconds per image of the
    measured ``model``) times ``calibration`` (a real cell's measured / projected seconds, what
    the component model leaves out: data loading, Python, smaller batches); returns the cost table
    (seconds per cell and per fine-tune)."""
    from midas_nb.study.cluster import profile_sweeps

    n_meas = model.patch_embed.num_patches + num_prefix_tokens(model)
    sweeps = profile_sweeps(get_profile("paper"), planned=True)
    cells = list({c.key: c for v in sweeps.values() for c in v}.values())
    N, depth = 196, 12
    cell_s: dict = {}
    finetune_s: dict = {}
    for bb, d in PAPER_WIDTHS.items():
        scale = _block_flops(d, N + 1) / _block_flops(model.embed_dim, n_meas)
        for ds, (n_train, n_test) in PAPER_SPLITS.items():
            mine = [c for c in cells if c.backbone == bb and c.dataset == ds]
            total = 0.0
            for L in sorted({c.depth for c in mine}):     # once per (dataset, backbone, L), cached on disk
                total += scale * (n_train * (per["block cache"] * L / 6 + per["targets"]) + n_test * per["block cache"] * L / 6)
            for c in mine:                                 # IDAUC dominates: S forwards per image
                total += scale * n_test * per["evaluate"] * PAPER_STEPS / args.steps
                if c.condition not in _UNTRAINED:
                    tokens = (depth - c.depth) * (math.ceil(c.budget * N) + 1) / ((depth - 6) * (math.ceil(0.25 * N) + 1))
                    total += scale * args.epochs * n_train * per["train"] * tokens
            if mine:
                cell_s.setdefault(bb, {})[ds] = calibration * total / len(mine)
            finetune_s.setdefault(bb, {})[ds] = scale * args.finetune_epochs * n_train * per["finetune"]
    hours = {name: sum(cell_s[c.backbone][c.dataset] for c in v) / 3600 for name, v in sweeps.items()}
    cells_h = sum(cell_s[c.backbone][c.dataset] for c in cells) / 3600
    ft_h = sum(v for b in finetune_s.values() for v in b.values()) / 3600
    print(f"\n(c) the paper profile, every notebook sweep ({len(cells):,} distinct cells; block FLOPs scaling from "
          f"width {model.embed_dim}, {n_meas} tokens to DeiT-Ti/S/B at 197 tokens):")
    for name, h in hours.items():
        print(f"  {name:<14} {len(sweeps[name]):>6,} cells {h:8.2f} h")
    print(f"cells calibrated by the real cell's measured/projected time: x {calibration:.2f}")
    print(f"projected paper profile: {cells_h + ft_h:.2f} h on this device = cells {cells_h:.2f} h + 9 fine-tunes "
          f"{ft_h:.2f} h; on 8 such devices >= {(cells_h + ft_h) / 8:.2f} h, on 32 >= {(cells_h + ft_h) / 32:.2f} h")
    print(f"goal <= {GOAL_PROFILE_HOURS:g} h for the whole paper profile on one H200; "
          f"profile ratio: {(cells_h + ft_h) / GOAL_PROFILE_HOURS:.3f}")
    return dict(cell_s=cell_s, finetune_s=finetune_s, calibration=calibration,
                per_image_ms={k: round(1e3 * v, 6) for k, v in per.items()})


def write_cost_table(path: Path, table: dict, name: str, args, date: str | None = None) -> None:
    """Write ``table`` measured on the device ``name`` (``"cpu"`` or the card) on ``date`` (default today, UTC)."""
    import datetime
    import json

    note = ("tiny model (--small) scaled by block FLOPs: says nothing about a GPU" if args.small else
            f"DeiT-S components timed at paper sizes, Ti and B by block FLOPs; cells x {table['calibration']:.2f}, "
            "a real cell's measured/projected time")
    path.parent.mkdir(parents=True, exist_ok=True)
    date = date or datetime.datetime.now(datetime.timezone.utc).date().isoformat()
    path.write_text(json.dumps(dict(table, device=name, date=date, note=note), indent=1))
    print(f"cost table written to {path}")


def one_cell(args, device: torch.device, kw: dict) -> float:
    """Real protocol cells end to end (run_protocol) on a synthetic set, beside the cost model.

    Two cells at L, b = 25 %: T5 seed 0 with empty caches (block-L states and target maps computed)
    then T5 seed 1 (both read from the on-disk cache), each printed beside its projection from
    part (b)'s per-image timings — the check that the cost model prices what a cell really does
    (data loading, Python overhead and the smaller batches of a real cell included)."""
    from midas_nb.data import load_dataset, make_synthetic_cub
    from midas_nb.analysis.protocol import run_protocol

    size = int(kw.get("img_size", 224))
    with tempfile.TemporaryDirectory() as tmp:
        root = make_synthetic_cub(Path(tmp) / "syn", num_classes=4, images_per_class=args.cell_images // 2,
                                  image_size=round(size * 256 / 224), seed=0)
        tr = load_dataset("cub", root, "train", image_size=size, patch_size=16)
        te = load_dataset("cub", root, "test", image_size=size, patch_size=16)
        torch.manual_seed(0)
        model = create_backbone(BACKBONE, tr.num_classes, weights=args.weights, device=device, **kw).eval()
        per = args.per
        shared = len(tr) * (per["block cache"] + per["targets"])
        each = len(tr) * per["train"] + len(te) * per["evaluate"]
        print(f"\nprotocol cells (run_protocol, T5, 1 epoch, batch {min(128, len(tr))}, {len(tr)} train / {len(te)} test "
              f"synthetic images, S={args.steps}, precision {PROFILES['paper']['precision']}), "
              "measured vs projected from (b):")
        for seed, what, projected in ((0, "empty caches", shared + each), (1, "cached block-L states and targets", each)):
            _sync(device)
            t = time.perf_counter()
            rows = run_protocol(tr, te, model, depth=args.depth, budget=0.25, conditions=["T5"], seeds=[seed],
                                dataset_name="synthetic", backbone_name=BACKBONE, checkpoint_id="gpu-check",
                                device=device, progress=False, epochs=1, batch_size=min(128, len(tr)),
                                idauc_steps=args.steps, bootstrap=50, cache_dir=Path(tmp) / "cache",
                                precision=PROFILES["paper"]["precision"])
            _sync(device)
            took = time.perf_counter() - t
            print(f"  seed {seed} ({what}): {took:.3g} s, projected {projected:.3g} s "
                  f"(measured/projected {took / projected:.2f}); mIoU {float(rows['miou'].iloc[0]):.3f}, "
                  f"IDAUC {float(rows['idauc'].iloc[0]):+.3f}")
    return took / projected                 # the second cell: what a sweep's cells after the first cost


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cuda", help="cuda (default), cuda:N or cpu")
    ap.add_argument("--small", action="store_true", help="tiny DeiT-S (64 px, width 32) for a CPU run in CI")
    ap.add_argument("--weights", default=None, help="a DeiT-S weights file (default: random init)")
    ap.add_argument("--depth", type=int, default=6)
    ap.add_argument("--batch", type=int, default=8, help="batch of the agreement checks")
    ap.add_argument("--time-batch", type=int, default=128, help="batch of the timings (the paper profile's)")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--steps", type=int, default=20, help="IDAUC steps S (paper profile: 20)")
    ap.add_argument("--epochs", type=int, default=10, help="scorer epochs (paper profile: 10)")
    ap.add_argument("--finetune-epochs", type=int, default=30, help="backbone epochs (paper profile: 30)")
    ap.add_argument("--cell-images", type=int, default=32, help="train (and test) images of the real cells")
    ap.add_argument("--cost-out", default=None, metavar="FILE",
                    help="write the cost table of part (c) (default: runs/bench/cell_cost.json on a CUDA device, "
                         "nowhere on the CPU)")
    ap.add_argument("--cos-min", type=float, default=0.98, help="min cosine of maps / gradients")
    ap.add_argument("--cos-min-step", type=float, default=0.95, help="min cosine of the scorer weight update")
    ap.add_argument("--prob-tol", type=float, default=0.05, help="max |dp| of pruned-forward probabilities")
    ap.add_argument("--auc-tol", type=float, default=0.03, help="max |dIDAUC|")
    args = ap.parse_args(argv)
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        print(f"gpu_check: --device {args.device} but this machine has no CUDA device; use --device cpu --small",
              file=sys.stderr)
        return 2
    device = torch.device(args.device)
    kw = dict(img_size=64, embed_dim=32, num_heads=2) if args.small else {}
    if args.small:
        args.time_batch = min(args.time_batch, 16)
        args.steps = min(args.steps, 8)
    if device.type == "cuda":
        print(f"device: {torch.cuda.get_device_name(device)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
    else:
        print(f"device: cpu ({torch.get_num_threads()} threads), torch {torch.__version__}"
              + (" [--small: a tiny DeiT-S, the timings say nothing about the GPU]" if args.small else ""))
    failed = agreement(args, device, kw)
    hours = projection(args, device, kw)
    calibration = one_cell(args, device, kw)
    table = profile_projection(args.per, args.model, args, calibration)
    if args.cost_out or device.type == "cuda":
        from midas_nb.sweeps.plan import default_cost_path
        write_cost_table(Path(args.cost_out) if args.cost_out else default_cost_path(), table,
                         torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", args)
    print(f"\n{'all checks passed' if not failed else f'{failed} check(s) MISMATCH'}; the last line is the paper "
          f"table's goal, <= {GOAL_HOURS:g} h on one H200 (the whole profile's, <= {GOAL_PROFILE_HOURS:g} h, is "
          f"part (c)'s profile ratio)")
    print(f"ratio: {hours / GOAL_HOURS:.3f}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
