"""`handformer speedrun TARGET`: train to a fixed quality as fast as this machine allows.

Each target is one file here (its data, its definition of done, how one run goes) registered in
`TARGETS`; `handformer/cli/speedrun.py` gives each its own subcommand. The record configs of a
target are built-in configs (`handformer/configs/speedrun_<target>_*.toml`, read by name from any
folder), one change a record; `benchmarks/speedrun.py` runs them beside their peer and prints the
record table (docs/speedrun.md).
"""

from __future__ import annotations

from handformer.speedrun import shakespeare
from handformer.speedrun.common import Target

TARGETS: dict[str, Target] = {t.name: t for t in (shakespeare.TARGET,)}
