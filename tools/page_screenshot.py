"""A screenshot of the search page of a running ``twotower serve``, taken by headless Chromium once the page shows its
hits (or an error), at real speed: the latencies in the picture are the ones measured.

    python tools/page_screenshot.py 'http://127.0.0.1:8000/?q=vitamin+D&mode=hybrid&k=5' docs/assets/search-page.png \
        --width 1280 --height 900 [--key-file api.key] [--full-page]

With ``--key-file`` (a service run with ``--keyed-reads``) the address carries the key as its password
(``http://page:KEY@host/``), which the browser answers the page's Basic challenge with, as a person would. The page
is loaded twice and the second load is taken (a warm service, as its users see it). Needs ``chromium`` on PATH (Debian: ``apt-get install chromium``) and the
``websockets`` package (Chromium is driven through its DevTools protocol).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import json
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.parse
import urllib.request
from pathlib import Path


async def capture(url: str, out: Path, width: int, height: int, key: str | None, full_page: bool,
                  timeout: float) -> None:
    import websockets

    browser = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if browser is None:
        sys.exit("no chromium on PATH (apt-get install chromium)")
    with tempfile.TemporaryDirectory() as profile:
        proc = subprocess.Popen([browser, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                                 "--hide-scrollbars", "--remote-debugging-port=0", f"--user-data-dir={profile}",
                                 "about:blank"],
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            port_file = Path(profile) / "DevToolsActivePort"
            deadline = time.monotonic() + 30
            while not (port_file.exists() and port_file.read_text().count("\n") >= 1):
                if time.monotonic() > deadline or proc.poll() is not None:
                    sys.exit("chromium did not start")
                await asyncio.sleep(0.1)
            port = port_file.read_text().split()[0]
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as answer:
                targets = json.loads(answer.read())
            page = next(t for t in targets if t["type"] == "page")
            async with websockets.connect(page["webSocketDebuggerUrl"], max_size=64 * 1024 * 1024) as ws:
                await drive(ws, url, out, width, height, key, full_page, timeout)
        finally:
            proc.terminate()
            proc.wait(timeout=10)


async def drive(ws, url, out, width, height, key, full_page, timeout) -> None:
    ids = iter(range(1, 1_000_000))
    pending: dict[int, asyncio.Future] = {}
    events: asyncio.Queue = asyncio.Queue()

    async def reader():
        async for raw in ws:
            msg = json.loads(raw)
            if "id" in msg and msg["id"] in pending:
                pending.pop(msg["id"]).set_result(msg)
            else:
                await events.put(msg)

    async def send(method, **params):
        n = next(ids)
        pending[n] = asyncio.get_running_loop().create_future()
        await ws.send(json.dumps({"id": n, "method": method, "params": params}))
        msg = await pending[n]
        if "error" in msg:
            raise RuntimeError(f"{method}: {msg['error']}")
        return msg.get("result", {})

    tasks = [asyncio.create_task(reader())]
    if key:
        scheme, rest = url.split("://", 1)
        url = f"{scheme}://page:{urllib.parse.quote(key, safe='')}@{rest}"
    check = ("(() => { const s = document.getElementById('status'), e = document.getElementById('error'), "
             "f = document.getElementById('filter-error'); const busy = !s || s.textContent.includes('…'); "
             "return !busy && ((s && / hits? /.test(s.textContent)) || (e && !e.hidden) || (f && !f.hidden)); })()")
    try:
        await send("Emulation.setDeviceMetricsOverride", width=width, height=height, deviceScaleFactor=1,
                   mobile=width < 600)
        await send("Page.enable")
        for _ in range(2):
            await send("Page.navigate", url=url)
            await asyncio.sleep(0.2)
            deadline = time.monotonic() + timeout
            while True:
                done = await send("Runtime.evaluate", expression=check, returnByValue=True)
                if done.get("result", {}).get("value"):
                    break
                if time.monotonic() > deadline:
                    raise SystemExit(f"the page showed no hits within {timeout} s")
                await asyncio.sleep(0.2)
        await asyncio.sleep(0.3)  # the last layout and paint
        params = {"format": "png"}
        if full_page:
            size = await send("Runtime.evaluate", expression="document.documentElement.scrollHeight",
                              returnByValue=True)
            params.update(captureBeyondViewport=True,
                          clip={"x": 0, "y": 0, "width": width, "height": size["result"]["value"], "scale": 1})
        shot = await send("Page.captureScreenshot", **params)
        out.write_bytes(base64.b64decode(shot["data"]))
        print(f"{out}: {out.stat().st_size:,} bytes")
    finally:
        for task in tasks:
            task.cancel()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("url")
    ap.add_argument("out", type=Path)
    ap.add_argument("--width", type=int, default=1280)
    ap.add_argument("--height", type=int, default=900)
    ap.add_argument("--key-file", type=Path, help="the service's API key (its first line), for --keyed-reads")
    ap.add_argument("--full-page", action="store_true", help="the whole page, not only the window")
    ap.add_argument("--timeout", type=float, default=60)
    args = ap.parse_args()
    key = args.key_file.read_text().splitlines()[0].strip() if args.key_file else None
    asyncio.run(capture(args.url, args.out, args.width, args.height, key, args.full_page, args.timeout))


if __name__ == "__main__":
    main()
