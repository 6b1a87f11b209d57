"""`handformer experiment NAME`: one of the tutorials' claims, measured over several seeds."""

from __future__ import annotations

import argparse
import shlex
import time


def cmd_experiment(args: argparse.Namespace) -> int:
    from handformer.experiments import EXPERIMENTS, get_experiment
    from handformer.experiments.runner import DEFAULT_THREADS, DEFAULT_WORKERS, run_experiment

    if args.names == ["list"]:
        width = max(len(n) for n in EXPERIMENTS)
        for name, exp in EXPERIMENTS.items():
            print(f"{name:<{width}}  {exp.claim}")
        print("\nrun: handformer experiment NAME [NAME ...] [--out DIR] [--seeds N]; "
              "all of them: handformer experiment all")
        return 0
    names = list(EXPERIMENTS) if args.names == ["all"] else [get_experiment(n).name for n in args.names]
    seeds = args.seeds if args.seeds is not None else (2 if args.smoke else 3)
    start = time.perf_counter()
    for name in names:
        command = "handformer experiment " + shlex.join(
            [name, "--out", args.out] + (["--seeds", str(args.seeds)] if args.seeds is not None else [])
            + (["--threads", str(args.threads)] if args.threads != DEFAULT_THREADS else [])
            + (["--workers", str(args.workers)] if args.workers != DEFAULT_WORKERS else [])
            + (["--smoke"] if args.smoke else []))
        run_experiment(EXPERIMENTS[name], args.out, seeds=seeds, smoke=args.smoke, command=command,
                       threads=args.threads, workers=args.workers)
    if len(names) > 1:
        print(f"{len(names)} experiments done in {time.perf_counter() - start:.0f} s")
    return 0


def add_parsers(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("experiment", help="measure one of the tutorials' claims (list: show them all)",
                       description="Train every variant of an experiment under several seeds and "
                                   "write its table (results.md, results.json) and plot into "
                                   "OUT/NAME/. 'list' shows the experiments, 'all' runs them all.")
    p.add_argument("names", nargs="+", metavar="NAME",
                   help="one or more experiments (run one after the other), 'list' or 'all'")
    p.add_argument("--out", default="runs/experiments", help="folder for the results (default: %(default)s)")
    p.add_argument("--seeds", type=int, default=None,
                   help="seeds per variant (default 3; at least 3 unless --smoke)")
    p.add_argument("--threads", type=int, default=1,
                   help="torch threads (default 1: the models are tiny, a second thread costs more "
                        "than it saves, and much more on a busy machine)")
    p.add_argument("--workers", type=int, default=2,
                   help="trials trained at once, one process each (default 2: one a core of a 2-core "
                        "CPU)")
    p.add_argument("--smoke", action="store_true",
                   help="a seconds-long configuration that checks the experiment runs (numbers mean nothing)")
    p.set_defaults(func=cmd_experiment)
