"""``cluster-kit keys [PREFIX] [--long]``: every key of a job spec, with its default, its type and
the first sentence of its comment in the schema (``--long``: all of it); the failures made on
purpose apart."""

from __future__ import annotations

import textwrap

DESCRIPTION = """Every key of a job spec (cluster/spec.py, train/contract/config.py): set it in the YAML, nested, or on
the command line as key=value (dotted: train.steps=200). PREFIX keeps the keys that start with it."""
EXAMPLE = "cluster-kit keys train.ckpt"


def add_arguments(parser) -> None:
    parser.add_argument("prefix", nargs="?", default="", help="only keys that start with this (train., program.)")
    parser.add_argument("--long", action="store_true", help="each key's whole note, not its first sentence")


def run(args) -> int:
    from cluster.spec import JobSpec  # the schema: this command's alone
    from train.contract.config import FAULTS, describe, field_notes, first_sentence

    notes = field_notes(JobSpec)
    rows = [(k, t, v, notes.get(k, "")) for k, t, v in describe(JobSpec) if k.startswith(args.prefix)]
    faults = {f"train.{name}" for name in FAULTS}
    if not rows:
        print(
            f"no key starts with {args.prefix!r}: {', '.join(sorted({k.split('.')[0] for k, _, _ in describe(JobSpec)}))}"
        )
        return 2
    width = max(len(k) for k, *_ in rows)
    shown = max(len(repr(v)) for _, _, v, _ in rows if len(repr(v)) <= 20)
    for heading, group in (("job spec keys (key=value; dotted for sections):", [r for r in rows if r[0] not in faults]),
                           ("failures made on purpose (drills and tests, train/trainer/faults.py):", [r for r in rows if r[0] in faults])):  # fmt: skip
        if group:
            print(heading)
            for key, kind, value, note in group:
                if args.long:  # the key, then its note wrapped under it
                    print(f"  {key} = {value!r}  ({kind})")
                    print(textwrap.fill(note or "", 100, initial_indent="      ", subsequent_indent="      "))
                    continue
                print(f"  {key:<{width}}  {repr(value):<{shown}}  {first_sentence(note) or kind}".rstrip())
    if not args.long and any(first_sentence(note) != note for *_, note in rows):
        print(f"(each key's whole note: cluster-kit keys {args.prefix or 'PREFIX'} --long)")
    return 0
