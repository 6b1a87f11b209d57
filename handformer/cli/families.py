"""`handformer families`: the model families handformer reads and writes, one spec file each."""

from __future__ import annotations

import argparse


def cmd_families(args: argparse.Namespace) -> int:
    from handformer.families.catalogue import table

    rows = table()
    columns = ["family", "model_type", "spec", "llama.cpp"]
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in columns}
    print("  ".join(c.ljust(widths[c]) for c in columns) + "  differences from the lesson's block")
    for r in rows:
        variants = f" (variants: {r['variants']})" if r["variants"] != "-" else ""
        print("  ".join(r[c].ljust(widths[c]) for c in columns) + f"  {r['differences']}{variants}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("families", help="list the model families import-hf and export-hf know: each one's "
                       "spec file, llama.cpp architecture and differences from the lesson's block")
    p.set_defaults(func=cmd_families)
