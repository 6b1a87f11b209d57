"""`handformer families`: the model families handformer reads and writes, one spec file each."""

from __future__ import annotations

import argparse


def cmd_families(args: argparse.Namespace) -> int:
    from handformer.families.catalogue import PARTS, table

    rows = table()
    heads = ["family", "model_type", "spec", "llama.cpp"]
    widths = {c: max(len(c), *(len(r[c]) for r in rows)) for c in heads}
    print("  ".join(c.ljust(widths[c]) for c in heads) + "  differences from the lesson's block")
    for r in rows:
        parts = " | ".join(f"{part}: {r[part]}" for part in PARTS if r[part] != "-") or "(the lesson's block)"
        variants = f" (variants: {r['variants']})" if r["variants"] != "-" else ""
        print("  ".join(r[c].ljust(widths[c]) for c in heads) + f"  {parts}{variants}")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("families", help="list the model families import-hf and export-hf know: each one's "
                       "spec file, llama.cpp architecture and differences from the lesson's block")
    p.set_defaults(func=cmd_families)
