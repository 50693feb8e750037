"""``cluster logs``' text report: the per-rank table, the first failure and its cascade,
hangs, stragglers and attempts."""

from __future__ import annotations

import re
from pathlib import Path

import orjson

from cluster.logs import stacks
from cluster.logs.report import Report, fmt_time
from cluster.logs.stacks import compress
from cluster.restarts.history import format_attempts

# The kit's own modules: an import error in one is the ranks' environment's, not the program's
KIT_MODULE = re.compile(r"(?:train|cluster)/[\w/]+\.py")


def format_report(report: Report, limit: int = 64, verbose: bool = False) -> str:
    """``verbose``: a traceback's frames of the kit's own too."""
    head = f"{'rank':>5} {'node':>5} {'host':<14} {'gpu':>4} {'state':<10} {'step':>7} {'loss':>9} {'ms/step':>8} {'last line':>13}"
    lines = [head]
    shown = report.ranks
    interesting = {r.rank for r in report.ranks if r.state != "completed" or r.straggler}
    if len(shown) > limit:  # keep what matters: failures, stragglers, and the edges
        shown = [r for r in report.ranks if r.rank in interesting or r.rank < 4 or r.rank >= report.world_size - 4][
            :limit
        ]
    for r in shown:
        loss = "-" if r.last_loss is None else f"{r.last_loss:.4f}"
        ms = "-" if r.median_step_ms is None else f"{r.median_step_ms:.2f}"
        flag = " straggler" if r.straggler else ""
        attempts = f" ({r.attempts} attempts)" if r.attempts > 1 else ""
        gpu = "-" if r.gpu is None else str(r.gpu)
        node = "-" if r.node is None else str(r.node)
        lines.append(
            f"{r.rank:>5} {node:>5} {r.host[:14]:<14} {gpu:>4} {r.state:<10} {r.last_step or '-':>7} {loss:>9} "
            f"{ms:>8} {fmt_time(r.last_time):>13}{flag}{attempts}"
        )
    if len(shown) < len(report.ranks):
        lines.append(f"  ... {len(report.ranks) - len(shown)} more completed ranks (--json lists all)")
    lines.append("")
    preempted = [r for r in report.ranks if r.state == "preempted"]
    lines.append(
        f"world size {report.world_size}: {report.completed} completed"
        + (f", {len(preempted)} preempted" if preempted else "")
        + (f", job pending: {report.pending}" if report.pending else ", job running" if report.running else "")
    )
    if preempted:
        lines.append(
            f"ranks {compress([r.rank for r in preempted])} stopped at the time-limit signal after a checkpoint at "
            f"step {max(r.last_step or 0 for r in preempted)}: its requeue, or the next job of the run (cluster-kit resume, --until-done), goes on from it"
        )
    cancelled = [r for r in report.ranks if r.state == "cancelled"]
    if cancelled:
        steps = sorted({r.last_step for r in cancelled if r.last_step is not None})
        after = f", after step {steps[0]}" if steps else ""
        if len(steps) > 1:
            after = f", after steps {steps[0]} to {steps[-1]}"
        lines.append(f"ranks {compress([r.rank for r in cancelled])}: {cancelled[0].error}{after}")
    retired = [r.rank for r in report.ranks if r.state == "retired"]
    if retired:
        lines.append(f"ranks {retired[0]}-{retired[-1]} retired: the last attempt went on with fewer nodes (min_nodes)")
    unwritten = [r for r in report.ranks if r.checkpoint_error]
    if unwritten:
        ranks = compress([r.rank for r in unwritten])
        lines.append(f"CHECKPOINT NOT WRITTEN on ranks {ranks}, {unwritten[0].checkpoint_error} (the run went on; "
                     "the checkpoint before it stayed latest)")  # fmt: skip
    for r in report.ranks:
        if r.exit_crash:  # not a failure: every result of the rank was written before
            lines.append(f"rank {r.rank} finished training, then crashed at exit: {r.exit_crash}")
    f = report.first_failure
    if f:
        lines.append("")
        lines.append(
            f"FIRST FAILURE: rank {f['rank']} on node {f['node']} ({f['host'] or '?'})"
            + ("" if f["gpu"] is None else f", GPU {f['gpu']}")
            + (f", at {fmt_time(f['time'])}" if f["time"] else "")
            + (f", in step {f['step']}" if f.get("step") is not None else "")
            + (f", after step {f['last_step']}" if f.get("step") is None and f["last_step"] else "")
        )
        lines.append(f"  {f['error']}")
        for frame in stacks.as_written(f["frames"], report.code_tree, verbose, report.kit_code)[-6:]:
            lines.append("  " + frame.replace("\n", "\n  "))
        roots = stacks.kit_roots(report.code_tree, report.kit_code)
        if f["error"].startswith(("ModuleNotFoundError", "ImportError")) and any(
            stacks.kit_path(x, roots, KIT_MODULE) for x in f["frames"]
        ):
            lines.append(
                "  the ranks' python lacks the kit's packages: install the kit there (docs/your-own-environment.md)"
            )
        lines.append(f"  log: {f['log']}")
        if f.get("evidence"):
            lines.append(f"  decided by: {f['evidence']}")
        same, cascade = split_cascade(report)
        for ranks in same.values():
            lines.append(f"the same error on {plural(len(ranks), 'other rank')} ({compress(ranks)}), each its own")
        if cascade:
            lines.append(
                f"cascade ({plural(sum(len(v) for v in cascade.values()), 'rank')}, consequences of the above):"
            )
            for label, ranks in cascade.items():
                lines.append(
                    f"  {len(ranks):>4} x {label}: {plural(len(ranks), 'rank', numbers=False)} {compress(ranks)}"
                )
    if report.hang:
        culprits = report.hang["culprits"]
        lines.append("")
        lines.append(
            f"HANG: culprit rank(s) {compress(culprits)} ({report.hang['reason'] or 'see groups'})"
            if culprits
            else "HANG: no rank stands out (every rank stopped in the same place); see the groups"
        )
        lines.append("  where each rank stopped: " + stacks.describe_groups(report.hang["groups"]))
        for rank, line in report.hang.get("last_lines", {}).items():
            lines.append(f"  rank {rank}'s last line {line or '(none of its own)'}")
    if report.flight_recorder and report.flight_recorder.get("behind"):
        fr = report.flight_recorder
        lines.append(
            f"NCCL flight recorder: last collective #{fr['max_seq']} on most ranks; "
            f"behind: {', '.join(f'rank {r} at #{n}' for r, n in fr['behind'].items())}"
        )
    if report.stragglers:
        lines.append(
            f"stragglers (median step time > median of all ranks + margin): ranks {compress(report.stragglers)}"
        )
    if report.attempts:
        last = "completed" if report.completed == report.world_size else "running" if report.running else "ended"
        lines += ["", *format_attempts(report.attempts, report.restarts, last)]
    return stacks.relative("\n".join(lines), report.code_tree)


def plural(n: int, word: str, numbers: bool = True) -> str:
    """``1 rank``, ``3 ranks`` (``numbers``: with the count)."""
    said = word if n == 1 else word + "s"
    return f"{n} {said}" if numbers else said


def split_cascade(report: Report) -> tuple[dict[str, list[int]], dict[str, list[int]]]:
    """The other failed ranks: those with the first failure's own error (an import error on
    every rank: each its own, not a consequence), and the cascade."""
    error = (report.first_failure or {}).get("error") or ""
    same = {k: v for k, v in report.cascade.items() if k and error.startswith(k.rstrip("…. "))}
    return same, {k: v for k, v in report.cascade.items() if k not in same}


def root_cause(report: Report, followed: int = 0) -> str:
    """One line for the top of ``--wait``'s end: the first failure, and where the rank that was
    followed (``followed``) failed after it, that its error printed above is a consequence."""
    f = report.first_failure
    if not f:
        return ""
    line = f"ROOT CAUSE: rank {f['rank']}: {stacks.relative(f['error'], report.code_tree)}"
    if f["rank"] != followed and any(followed in ranks for ranks in split_cascade(report)[1].values()):
        line += f" (rank {followed}'s error above is a consequence of it)"
    return line


def tail(path: Path, k: int) -> list[str]:
    with path.open(errors="replace") as f:
        return f.readlines()[-k:]


def report_json(report: Report) -> list[bytes]:
    """``cluster logs --json``: one object, a line per key and a line per rank, as UTF-8 pieces
    to write one after the other. Readable, and fast: orjson writes the ranks in one call
    (16,384 in 3 ms), and the line breaks go where one rank's object ends and the next begins
    (a quote inside a string is escaped, so ``},{"rank":`` is found only there); the
    megabytes are neither decoded nor joined (each copy of them costs as much as writing them)."""
    pieces = [b"{\n"]
    for key, value in report.to_json_but_ranks().items():
        pieces.append(b"" if len(pieces) == 1 else b",\n")
        if key == "ranks" and value:
            inner = orjson.dumps(value)[1:-1].replace(b'},{"rank":', b'},\n  {"rank":')
            pieces += [b' "ranks": [\n  ', inner, b"\n ]"]
        else:
            pieces.append(b" " + orjson.dumps(key) + b": " + orjson.dumps(value))
    return [*pieces, b"\n}\n"]
