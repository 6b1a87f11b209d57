"""Take docs/figures/playground.png: the playground page of `handformer serve`, in headless chromium,
after a seeded generation on a language-model run, one token clicked and the sliders moved.

    python3 -m handformer import-llama2c stories260K.bin tok512.bin /tmp/stories
    python3 scripts/playground_screenshot.py stories260K=/tmp/stories docs/figures/playground.png

Needs the dev extra (playwright) and the system chromium (scripts/install.sh installs both).
"""

from __future__ import annotations

import argparse
import socket
import tempfile
import threading
import time
from pathlib import Path

import uvicorn
from playwright.sync_api import sync_playwright

from handformer.io import atomic_write_bytes
from handformer.serve.app import create_app
from handformer.serve.registry import load_served_models

ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", help="RUN_DIR or NAME=RUN_DIR, as `handformer serve` takes it")
    parser.add_argument("out")
    parser.add_argument("--prompt", default="Once upon a time, there was a little girl")
    parser.add_argument("--seed", type=int, default=3)
    parser.add_argument("--max-tokens", type=int, default=40)
    parser.add_argument("--click", type=int, default=6, help="the generated token to click, from 0")
    args = parser.parse_args()

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_app(load_served_models([args.run_dir])), host="127.0.0.1",
                                           port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    while not server.started:
        time.sleep(0.05)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path="/usr/bin/chromium", headless=True, args=ARGS)
        page = browser.new_page(viewport={"width": 1500, "height": 1000}, device_scale_factor=1)
        page.goto(f"http://127.0.0.1:{port}/")
        page.wait_for_selector("body[data-ready=true]", state="attached")
        page.fill("#prompt", args.prompt)
        page.fill("#seed", str(args.seed))
        page.fill("#max-tokens", str(args.max_tokens))
        set_range = "(e, v) => { e.value = String(v); e.dispatchEvent(new Event('input')); }"
        page.eval_on_selector("#temperature", set_range, 0.8)
        page.click("#go")
        page.wait_for_selector("body[data-generated]", state="attached", timeout=60_000)
        first = page.eval_on_selector("#chips .chip.gen", "c => Number(c.dataset.pos)")
        page.click(f"#chips .chip[data-pos='{first + args.click}']")
        page.wait_for_selector(f"body[data-attention='{first + args.click}']", state="attached")
        page.eval_on_selector("#top-k", set_range, 12)
        page.eval_on_selector("#top-p", set_range, 0.8)
        with tempfile.TemporaryDirectory() as tmp:
            shot = Path(tmp) / "playground.png"
            page.screenshot(path=str(shot), full_page=True)
            atomic_write_bytes(args.out, shot.read_bytes())
        browser.close()
    server.should_exit = True
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
