"""``python -m bench.scaling [--quick] [--ranks 1,2] [--json] [--plot F] | --predict key=value ...``"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from bench import scaling
from bench.scaling.fit import predict
from bench.scaling.plot import plot
from bench.scaling.report import format_result
from bench.scaling.study import FIT_FILE, FULL, QUICK, RUN_DIR, save, study
from train.contract.errors import ConfigError


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.scaling", description=scaling.__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the small grid (< 2 min on 2 cores; CI)")
    parser.add_argument("--ranks", default="1,2", help="rank counts, comma-separated (e.g. 1,2,4)")
    parser.add_argument("--json", action="store_true", help="print one JSON object: points, fit, ...")
    parser.add_argument("--run-dir", default=RUN_DIR, help=f"where {FIT_FILE} (points and fit) is saved")
    parser.add_argument("--plot", help="write the log-log plot of time to train vs parameters to this PNG")
    parser.add_argument("--predict", action="store_true", help="predict key=value's time to train from the saved fit")
    parser.add_argument("overrides", nargs="*", metavar="key=value", help="with --predict: the configuration")
    args = parser.parse_args(argv)
    saved = Path(args.run_dir) / FIT_FILE
    try:
        if args.predict:
            if not saved.exists():
                raise ConfigError("--run-dir", f"no saved fit at {saved}: run `python -m bench.scaling` first")
            print(predict(json.loads(saved.read_text()), args.overrides))
            return 0
        if args.overrides:
            raise ConfigError(args.overrides[0], "overrides are for --predict; the grid is fixed (see --quick)")
        ranks = sorted({int(r) for r in args.ranks.split(",") if r.strip()} | {1})
    except (ConfigError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    log = (lambda *a: print(*a, file=sys.stderr, flush=True)) if args.json else (lambda *a: print(*a, flush=True))
    result = study(QUICK if args.quick else FULL, ranks, progress=log)
    save(result, args.run_dir)
    if args.plot:
        plot(result, args.plot)
    print(json.dumps(result, indent=1) if args.json else format_result(result))
    log(f"saved to {saved}; predict with: python -m bench.scaling --predict model.dim_hidden=2048 ...")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
