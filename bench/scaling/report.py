"""The study's result in words: the terminal's summary and docs/benchmarks.md's section."""

from __future__ import annotations


def format_result(r: dict) -> str:
    fit, mult, dp = r["fit"], r["multiplicative"], r["data_parallel"]
    lines = [
        f"fit: step = {fit['t0_ms']:.3f} ms + {fit['k']:.2f} x the step's matmuls timed alone "
        f"(rms relative error {fit['rms_relative_error']:.1%})",
        "held-out points (fit without their model size):",
    ]
    for h in fit["held_out"]:
        lines.append(f"  params {h['params']:>10,} train_size {h['train_size']:>6} batch {h['batch_size']:>4}: "
                     f"predicted {h['predicted']:8.3f} s, measured {h['measured']:8.3f} s, off by {h['error']:.0%}")  # fmt: skip
    lines.append(
        f"multiplicative? both grown {mult['both_grown_s']:.2f} s; model x data / base predicts "
        f"{mult['multiplicative_prediction_s']:.2f} s (off {mult['multiplicative_error']:.0%}); additive predicts "
        f"{mult['additive_prediction_s']:.2f} s (off {mult['additive_error']:.0%})"
    )
    for row in dp["rows"]:
        lines.append(
            f"data parallel: params {row['params']:>10,}: {row['nprocs']} ranks {row['speedup']:.2f}x (ideal {row['ideal']}x)"
        )
    pays = dp["pays_above_params"]
    if pays is not None:
        where = ("for every size measured" if pays == 0 else "for no size measured" if pays == float("inf")
                 else f"above about {pays:,.0f} parameters")  # fmt: skip
        lines.append(f"Data parallelism pays {where} (gloo over loopback on {r['machine']['cores']} cores)")
    return "\n".join(lines)


def markdown(r: dict, png: str | None) -> list[str]:
    """The scaling section of docs/benchmarks.md: a table per axis, the fit, its checks."""
    fit, mult, dp, grid = r["fit"], r["multiplicative"], r["data_parallel"], r["grid"]
    b0, sizes = grid["batch"][0], grid["train_size"]
    single = {
        (x["params"], x["data"]["train_size"]): x for x in r["points"] if x["nprocs"] == 1 and x["batch_size"] == b0
    }
    params = sorted({p for p, _ in single})
    dims = {x["params"]: x["model"]["dim_hidden"] for x in r["points"]}
    out = [
        "## Scaling study: model size x data size x ranks",
        "",
        f"`python -m bench.scaling` (written by `make bench`): every point a real run of {grid['epochs']} epoch(s) "
        f"in fresh processes (`python -m train`, torchrun for 2 ranks: `single` vs `ddp`); time to train = steps x the "
        f"steady-state step time (start-up and evaluation excluded). Batch {b0} unless stated. "
        f"{r['machine']['cores']} CPU cores, gloo over loopback, one intra-op thread per rank (`OMP_NUM_THREADS=1`, "
        "so that timings hold with other work on the machine): 2 ranks use 2 cores.",
        "",
        "### Model size (1 rank)",
        "",
        "| dim_hidden | parameters | ms/step | "
        + " | ".join(f"time, {n:,} samples (s)" for n in sizes)
        + " | samples/s |",
        "|---:|---:|---:|" + "---:|" * len(sizes) + "---:|",
    ]
    for p in params:
        x = single[p, sizes[-1]]
        times = " | ".join(f"{single[p, n]['time_s']:.3f}" for n in sizes)
        out.append(f"| {dims[p]} | {p:,} | {x['step_ms']:.3f} | {times} | {x['samples_per_s']:,.0f} |")
    out += ["", f"### Data size (1 rank): time ratio {sizes[-1]:,} / {sizes[0]:,} samples (ideal {sizes[-1] / sizes[0]:g})",
            "", "| parameters | time ratio |", "|---:|---:|"]  # fmt: skip
    out += [f"| {p:,} | {single[p, sizes[-1]]['time_s'] / single[p, sizes[0]]['time_s']:.2f} |" for p in params]
    out += ["", "### Ranks: speed-up over 1 rank (largest data size)", "",
            "| parameters | ranks | speed-up | ideal |", "|---:|---:|---:|---:|"]  # fmt: skip
    out += [f"| {x['params']:,} | {x['nprocs']} | {x['speedup']:.2f}x | {x['ideal']}x |" for x in dp["rows"]]
    out += [
        "",
        "### Cost model",
        "",
        f"step time = **{fit['t0_ms']:.3f} ms + {fit['k']:.2f} x kernels**, where kernels is the time of the step's "
        "matrix multiplies (each Linear layer's forward and two backward matmuls at that batch) timed alone on this "
        f"machine; t0 and k fitted on the {len(fit['points'])} single-rank points (rms relative error "
        f"{fit['rms_relative_error']:.1%}); time to train = steps x step time. "
        "Held out: each inner model size, predicted by a fit without it:",
        "",
        "| parameters | samples | batch | predicted (s) | measured (s) | off by |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    out += [f"| {h['params']:,} | {h['train_size']:,} | {h['batch_size']} | {h['predicted']:.3f} | {h['measured']:.3f} "
            f"| {h['error']:.0%} |" for h in fit["held_out"]]  # fmt: skip
    worst = max((h["error"] for h in fit["held_out"]), default=0)
    out += [
        "",
        f"Worst held-out error: **{worst:.0%}**.",
        "",
        f"The notes' claim, cost grows multiplicatively: base {mult['base_s']:.3f} s, model grown {mult['model_grown_s']:.3f} s, "
        f"data grown {mult['data_grown_s']:.3f} s, both grown **{mult['both_grown_s']:.3f} s**; model x data / base predicts "
        f"{mult['multiplicative_prediction_s']:.3f} s (off {mult['multiplicative_error']:.0%}), model + data - base predicts "
        f"{mult['additive_prediction_s']:.3f} s (off {mult['additive_error']:.0%}).",
        "",
        format_result(r).splitlines()[-1] + ".",
    ]
    if png:
        out += ["", f"![time to train vs parameters]({png})"]
    return out + [""]
