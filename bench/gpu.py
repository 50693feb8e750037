"""``python -m bench.gpu``: the kit's loop at the GPU's speed, side by side in one process.

Rows, for ``jobs/bench_gpu.yaml`` (or ``--spec``): the matmul ceiling (one of the model's
hidden matmuls, batch x hidden x hidden, in bf16 and fp32); then, per precision the kit offers,
a hand-written loop (its data made on the device, plain ``nn.Linear`` layers, torch's SGD,
nothing of the kit) and the kit's own loop (``train.trainer.loop.run``: its loader, records, watchdog).
The process runs with the intra-op threads a job of that spec gets (``cpus_per_task``), not
one. Contenders run in interleaved rounds; the kit's ratio to the hand loop of its precision
is taken within each round and the median reported. MFU is the model's matmul FLOPs (6 per
multiply-add and sample: forward, and backward's two) per second over the GPU's dense peak of
the precision's matmul dtype (``PEAK_FLOPS``). Also: a fresh process's time from after its
``import torch`` to the end of its first training step, in phases (the kit's imports, the
device's context, the model and data built there and the first step's kernels), beside the
hand loop's in a process of its own.

On the CPU it runs too (``--device cpu``, small overrides: the tests), without MFU.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
from torch import nn

from cluster.spec import JobSpec
from train.contract.config import Config, as_overrides, load
from train.contract.errors import ConfigError
from train.rank.dist_env import from_environ
from train.trainer.loop import autocast_context, param_dtype, run
from train.trainer.model import flops_per_sample, layer_dims

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "jobs/bench_gpu.yaml"
# Dense peak FLOP/s by GPU name and matmul dtype (vendor data sheets, without sparsity).
PEAK_FLOPS = {
    "H200": {"bf16": 989e12, "fp32": 67e12},
    "H100": {"bf16": 989e12, "fp32": 67e12},
    "A100": {"bf16": 312e12, "fp32": 19.5e12},
    "L40S": {"bf16": 362e12, "fp32": 91.6e12},
}
PRECISIONS = ("fp32", "bf16", "fp16", "bf16_params")
# The dtype whose peak a precision's matmuls run at (fp16's tensor-core peak is bf16's).
MATMUL_DTYPE = {"fp32": "fp32", "bf16": "bf16", "fp16": "bf16", "bf16_params": "bf16"}


def peak_flops(device: str, dtype: str) -> float | None:
    """The device's dense peak for ``dtype``, None for a device PEAK_FLOPS does not know."""
    return next((v[dtype] for k, v in PEAK_FLOPS.items() if k in device), None)


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def matmul_ceiling(device: torch.device, m: int, k: int, n: int, dtype: torch.dtype, reps: int = 50) -> float:
    """TFLOP/s of an (m x k) @ (k x n) matmul, repeated back to back."""
    a = torch.randn(m, k, device=device, dtype=dtype)
    b = torch.randn(k, n, device=device, dtype=dtype)
    for _ in range(3):
        a @ b
    synchronize(device)
    start = time.perf_counter()
    for _ in range(reps):
        a @ b
    synchronize(device)
    return 2 * m * k * n * reps / (time.perf_counter() - start) / 1e12


def backward_and_step(loss: torch.Tensor, opt: torch.optim.Optimizer, scaler: torch.amp.GradScaler | None) -> None:
    """A hand-written loop's backward and optimizer step (through the GradScaler for fp16)."""
    if scaler:
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    else:
        loss.backward()
        opt.step()


def hand_loop(cfg: Config, device: torch.device, steps: int) -> float:
    """The loop a user writes by hand for the GPU: data made on the device, batches sliced from
    a permutation there, fused SGD on CUDA. Seconds per step over the second half."""
    precision, m, d = cfg.train.precision, cfg.model, cfg.data
    dtype = param_dtype(precision)
    torch.manual_seed(cfg.train.seed)
    x = torch.randn(d.train_size, m.dim_in, device=device, dtype=dtype)
    y = torch.randint(m.n_classes, (d.train_size,), device=device)
    layers: list[nn.Module] = []
    for i, (a, b) in enumerate(layer_dims(m)):
        layers += [nn.ReLU()] if i else []
        layers.append(nn.Linear(a, b, device=device, dtype=dtype))
    model = nn.Sequential(*layers)
    opt = torch.optim.SGD(model.parameters(), lr=cfg.optim.lr, fused=device.type == "cuda" or None)
    autocast = autocast_context(precision, device)
    scaler = torch.amp.GradScaler(device.type) if precision == "fp16" else None
    batch = cfg.train.batch_size
    perm = torch.randperm(d.train_size, device=device)
    start = 0.0
    for step in range(steps):
        if step == steps // 2:
            synchronize(device)
            start = time.perf_counter()
        at = step * batch % (d.train_size - batch + 1)
        idx = perm[at : at + batch]
        with autocast():
            loss = nn.functional.cross_entropy(model(x[idx]).float(), y[idx])
        backward_and_step(loss, opt, scaler)
        opt.zero_grad(set_to_none=True)
    synchronize(device)
    return (time.perf_counter() - start) / (steps - steps // 2)


def kit_loop(cfg: Config, device: torch.device) -> float:
    """The kit's loop, as a job's rank runs it: seconds per step over the second half (its own
    step record; the log step's read of the loss waits for the GPU)."""
    with tempfile.TemporaryDirectory() as tmp:
        cfg.train.run_dir = tmp
        record = run(cfg, from_environ({}, device=device.type), quiet=True)
    return record["step_ms"] / 1e3


def contender_config(overrides: list[str], precision: str, steps: int, compiled: bool, device: torch.device) -> Config:
    return load(Config, None, [
        *overrides, f"train.precision={precision}", f"train.steps={steps}", f"train.log_every={steps // 2}",
        f"train.eval_every={steps}", "train.ckpt_every=0", f"train.compile={str(compiled).lower()}",
        f"train.device={device.type}",
    ])  # fmt: skip


def startup(overrides: list[str], device: torch.device) -> dict:
    """Fresh processes, one for the kit's loop and one for the hand loop: ``import torch``'s
    seconds, then the phases from after it to the end of the first training step (the kit's
    imports, CUDA's context, the model and data set built and step 1). The hand loop's process
    imports this module too; its ``imports_s`` is reported but not its own."""
    code = (
        "import time, json, sys; t0 = time.perf_counter(); import torch; t1 = time.perf_counter(); "
        "from bench.gpu import first_step; print(json.dumps({'import_torch_s': t1 - t0, "
        "**first_step(sys.argv[1], sys.argv[2:], t1)}))"
    )
    phases = {}
    for loop in ("kit", "hand"):
        out = subprocess.run([sys.executable, "-c", code, loop, *overrides, f"train.device={device.type}"],
                             cwd=ROOT, capture_output=True, text=True, check=True)  # fmt: skip
        phases[loop] = json.loads(out.stdout.strip().splitlines()[-1])
    kit = phases["kit"]
    return {**kit, "to_first_step_s": kit["imports_s"] + kit["context_s"] + kit["first_step_s"], "hand": phases["hand"]}


def first_step(loop: str, overrides: list[str], after_torch: float) -> dict:
    """Seconds, by perf_counter, from ``after_torch`` to: this module imported (``imports_s``);
    the device's context made (``context_s``); one step of ``loop`` done, its kernels finished,
    the model and data built before it (``first_step_s``)."""
    imported = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        cfg = load(Config, None, [*overrides, "train.steps=1", f"train.run_dir={tmp}"])
        env = from_environ({}, device=cfg.train.device)
        device = torch.device(env.device)
        torch.empty(1, device=device)
        synchronize(device)
        context = time.perf_counter()
        if loop == "kit":
            run(cfg, env, quiet=True)
        else:
            hand_loop(cfg, device, 1)
        synchronize(device)
        done = time.perf_counter()
    return {"imports_s": imported - after_torch, "context_s": context - imported, "first_step_s": done - context}


def benchmark(overrides: list[str], device: torch.device, precisions: list[str], rounds: int, steps: int,
              compiled: bool, progress=print) -> dict:  # fmt: skip
    base = load(Config, None, overrides)
    flops_step = flops_per_sample(base.model) * base.train.batch_size
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    m, k = base.train.batch_size, base.model.dim_hidden
    ceilings = {
        dtype: matmul_ceiling(device, m, k, k, torch.bfloat16 if dtype == "bf16" else torch.float32)
        for dtype in ("bf16", "fp32")
    }
    contenders = [(p, loop) for p in precisions for loop in ("hand", "kit")]
    if compiled:
        contenders += [(p, "kit+compile") for p in precisions]
    times: dict[tuple[str, str], list[float]] = {c: [] for c in contenders}
    for r in range(rounds):
        for precision, loop in contenders if r % 2 == 0 else contenders[::-1]:
            cfg = contender_config(overrides, precision, steps, loop == "kit+compile", device)
            seconds = hand_loop(cfg, device, steps) if loop == "hand" else kit_loop(cfg, device)
            times[(precision, loop)].append(seconds)
            progress(f"round {r + 1}/{rounds}  {loop:<12} {precision:<12} {seconds * 1e3:9.3f} ms/step")
    rows = [
        {"loop": "matmul", "precision": dtype, "tflops": t, "mfu": mfu(t, name, dtype)} for dtype, t in ceilings.items()
    ]
    for precision, loop in contenders:
        step_s = statistics.median(times[(precision, loop)])
        tflops = flops_step / step_s / 1e12
        row = {"loop": loop, "precision": precision, "ms_per_step": step_s * 1e3, "tflops": tflops,
               "mfu": mfu(tflops, name, MATMUL_DTYPE[precision])}  # fmt: skip
        if loop != "hand":  # per round: the rounds' neighbouring runs share the machine's state
            ratios = [h / s for h, s in zip(times[(precision, "hand")], times[(precision, loop)])]
            row["vs_hand"] = statistics.median(ratios)
        rows.append(row)
    return {
        "device": name,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "threads": torch.get_num_threads(),
        "flops_per_step": flops_step,
        "rounds": rounds,
        "steps": steps,
        "overrides": overrides,
        "rows": rows,
        "startup": startup(overrides, device),
    }


def mfu(tflops: float, device: str, dtype: str) -> float | None:
    peak = peak_flops(device, dtype)
    return tflops * 1e12 / peak if peak else None


def table(result: dict) -> list[str]:
    """The result as a markdown table, with the run's facts above it."""
    s = result["startup"]
    lines = [
        f"{result['device']}, torch {result['torch']}, CUDA {result['cuda'] or '-'}, {result['threads']} intra-op "
        f"threads; {result['flops_per_step'] / 1e12:.3g} TFLOP a step; median of {result['rounds']} interleaved "
        f"rounds of {result['steps']} steps (the second half timed).",
        "",
        "| loop | precision | ms/step | TFLOP/s | MFU | kit / hand |",
        "|---|---|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        ms = f"{r['ms_per_step']:.2f}" if "ms_per_step" in r else "-"
        share = f"{r['mfu']:.1%}" if r["mfu"] is not None else "-"
        ratio = f"{r['vs_hand']:.3f}" if "vs_hand" in r else ""
        lines.append(f"| {r['loop']} | {r['precision']} | {ms} | {r['tflops']:.3g} | {share} | {ratio} |")
    lines += ["", f"Start-up of a fresh process: `import torch` {s['import_torch_s']:.2f} s, then "
                  f"{s['to_first_step_s']:.2f} s to the end of its first step: the kit's imports {s['imports_s']:.2f} s, "
                  f"the device's context {s['context_s']:.2f} s, the model and data built and step 1 "
                  f"{s['first_step_s']:.2f} s (the hand loop's, in a process of its own: context "
                  f"{s['hand']['context_s']:.2f} s, built and step 1 {s['hand']['first_step_s']:.2f} s)."]  # fmt: skip
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu", description=__doc__.split("\n\n")[0])
    parser.add_argument("--spec", default=str(SPEC), help="the job spec whose model, data, batch and cpus_per_task run")
    parser.add_argument("--device", choices=["auto", "cuda", "cpu"], default="auto")
    parser.add_argument(
        "--precisions", default=",".join(PRECISIONS), help="comma-separated, of " + ", ".join(PRECISIONS)
    )
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=None, help="per run (default: the spec's train.steps)")
    parser.add_argument("--compile", action="store_true", help="also the kit's loop with train.compile")
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="training config overrides")
    args = parser.parse_args(argv)
    precisions = [p for p in args.precisions.split(",") if p]
    try:
        spec = load(JobSpec, args.spec)
        overrides = [*as_overrides(spec.train_dict()), *args.overrides]
        base = load(Config, None, overrides)
        for p in precisions:
            if p not in PRECISIONS:
                raise ConfigError("--precisions", f"{p!r} is not one of {', '.join(PRECISIONS)}")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    device = torch.device(from_environ({}, device=args.device).device)  # auto: the GPU where there is one
    if device.type == "cpu" and "fp16" in precisions:
        precisions.remove("fp16")  # fp16 needs the GradScaler's CUDA path (train.precision refuses it)
    torch.set_num_threads(spec.cpus_per_task or torch.get_num_threads())  # what a rank of this spec gets
    log = (lambda *a: print(*a, file=sys.stderr)) if args.json else print
    result = benchmark(overrides, device, precisions, args.rounds, args.steps or base.train.steps, args.compile, log)
    result["spec"] = str(args.spec)
    print(json.dumps(result, indent=1) if args.json else "\n" + "\n".join(table(result)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
