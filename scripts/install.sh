#!/usr/bin/env bash
# Install handformer and its development tools into the current Python environment.
# Torch first: with no torch present, pin the CPU build 2.13.0 (a plain `torch` requirement would
# pull a multi-GB CUDA build). An existing torch >= 2.4 is kept as it is.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
if ! "$PY" -c "import torch" >/dev/null 2>&1; then
    "$PY" -m pip install --quiet torch==2.13.0
fi
"$PY" -m pip install --quiet -e ".[dev]"

# Optional system packages, from Debian where apt-get is available: chromium for the attention
# explorer's browser test (tests/test_explorer_browser.py, skipped without it) and a CJK font so
# Chinese/Japanese/Korean token labels render in plots (a one-line warning without it). A failure
# here only skips or degrades those; it never fails the install.
missing=()
[ -x /usr/bin/chromium ] || missing+=(chromium)
[ -n "$(find /usr/share/fonts -iname '*cjk*' -o -iname 'wqy*' 2>/dev/null | head -n 1)" ] \
    || missing+=(fonts-noto-cjk)
if [ ${#missing[@]} -gt 0 ]; then
    if command -v apt-get >/dev/null 2>&1 && [ "$(id -u)" -eq 0 ]; then
        echo "installing ${missing[*]} with apt-get" >&2
        if ! { apt-get update -qq \
                && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends \
                   -o DPkg::Lock::Timeout=300 "${missing[@]}"; } >/tmp/handformer-apt.log 2>&1; then
            echo "note: apt-get could not install ${missing[*]} (see /tmp/handformer-apt.log); the" \
                 "browser test will be skipped and CJK labels will warn" >&2
        fi
    else
        echo "note: ${missing[*]} not installed (needs apt-get as root); the browser test will be" \
             "skipped and CJK labels will warn" >&2
    fi
fi
