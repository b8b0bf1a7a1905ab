"""The report page in a real browser: headless Chromium, driven over the
DevTools protocol on a pipe (--remote-debugging-pipe: JSON messages ending in
NUL on file descriptors 3 and 4, no client library). It checks what a reader
would see: every section there, no table whose rows have more or fewer cells
than its header, every figure decoded, nothing on the console, the table
sorting and filtering; and keeps a screenshot (its path is printed).

Install Chromium with `apt-get install -y chromium` (Debian/Ubuntu; CI's
.ci/run does it); the test skips only when no Chromium binary is found, and
fails instead under CI (CI set), where the report must be seen in a browser. Set
PERFSUITE_BROWSER_RUN=<run dir> to check a real run's report instead of the
built one (it is rendered into a temporary copy of results.json).
"""

from __future__ import annotations

import base64
import json
import os
import shutil
import subprocess
import time
from pathlib import Path
from urllib.parse import unquote

import pytest

from perfsuite.report import html
from tests.unit.test_report import cell, profile_pair, run

BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable", "chrome")
SECTIONS = ("summary", "attention", "probe", "cells", "figures", "details", "skipped", "environment")
TIMEOUT_S = 60.0


def find_browser() -> str | None:
    explicit = os.environ.get("PERFSUITE_CHROMIUM")
    if explicit:
        return explicit if shutil.which(explicit) else None
    return next((path for name in BROWSERS if (path := shutil.which(name))), None)


def require_browser() -> str:
    """The Chromium binary; without one a skip on a workstation, a failure
    under CI (``CI`` set), whose report test must run, not skip."""
    binary = find_browser()
    if binary is None:
        why = ("no Chromium binary found (looked for " + ", ".join(BROWSERS) + "; or set "
               "PERFSUITE_CHROMIUM): install it with `apt-get install -y chromium` (Debian/"
               "Ubuntu; .ci/run does this in CI)")
        if os.environ.get("CI", "").lower() not in ("", "0", "false", "no"):
            pytest.fail(f"CI is set and {why}", pytrace=False)
        pytest.skip(why)
    return binary


class DevTools:
    """A minimal Chrome DevTools Protocol client over --remote-debugging-pipe."""

    def __init__(self, binary: str, profile_dir: Path, width: int = 1400, height: int = 1000):
        to_browser_r, self._to_browser = os.pipe()
        self._from_browser, from_browser_w = os.pipe()

        def give_pipes() -> None:  # the browser reads commands on fd 3, answers on fd 4
            import fcntl

            # moved above 9 first: a pipe end may itself be fd 3 or 4
            read, write = (fcntl.fcntl(fd, fcntl.F_DUPFD, 10) for fd in (to_browser_r, from_browser_w))
            for fd, target in ((read, 3), (write, 4)):
                os.dup2(fd, target)  # dup2 leaves the target inheritable across exec
                os.set_inheritable(target, True)

        args = [binary, "--headless=new", "--remote-debugging-pipe", "--disable-gpu",
                "--no-first-run", "--no-default-browser-check", "--disable-extensions",
                "--disable-background-networking", "--disable-sync", "--mute-audio",
                "--allow-file-access-from-files", f"--user-data-dir={profile_dir}",
                f"--window-size={width},{height}", "about:blank"]
        if os.geteuid() == 0:
            args.insert(1, "--no-sandbox")  # Chromium refuses to run as root with its sandbox
        self.log = profile_dir.with_name("chromium.log")  # a file: a full pipe would stall it
        with self.log.open("wb") as log:
            self.process = subprocess.Popen(args, preexec_fn=give_pipes, close_fds=False,
                                            stdout=subprocess.DEVNULL, stderr=log)
        os.close(to_browser_r)
        os.close(from_browser_w)
        self._buffer = b""
        self._next_id = 0
        self.events: list[dict] = []

    def _read_message(self, deadline: float) -> dict:
        while b"\0" not in self._buffer:
            if time.monotonic() > deadline:
                raise TimeoutError("no answer from Chromium")
            chunk = os.read(self._from_browser, 1 << 20)
            if not chunk:
                raise RuntimeError(f"Chromium closed the pipe: {self.stderr_tail()}")
            self._buffer += chunk
        message, self._buffer = self._buffer.split(b"\0", 1)
        return json.loads(message)

    def send(self, method: str, params: dict | None = None, session: str | None = None) -> dict:
        self._next_id += 1
        request = {"id": self._next_id, "method": method, "params": params or {}}
        if session:
            request["sessionId"] = session
        os.write(self._to_browser, json.dumps(request).encode() + b"\0")
        deadline = time.monotonic() + TIMEOUT_S
        while True:
            message = self._read_message(deadline)
            if message.get("id") == self._next_id:
                if "error" in message:
                    raise RuntimeError(f"{method}: {message['error']}")
                return message.get("result", {})
            self.events.append(message)

    def wait_for(self, method: str, session: str | None = None) -> dict:
        deadline = time.monotonic() + TIMEOUT_S
        for i, event in enumerate(self.events):
            if event.get("method") == method and event.get("sessionId") == session:
                return self.events.pop(i)
        while True:
            message = self._read_message(deadline)
            if message.get("method") == method and message.get("sessionId") == session:
                return message
            self.events.append(message)

    def stderr_tail(self) -> str:
        return self.log.read_text(errors="replace")[-2000:]

    def close(self) -> None:
        try:
            self.send("Browser.close")
        except (RuntimeError, TimeoutError, OSError):
            pass
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        for fd in (self._to_browser, self._from_browser):
            os.close(fd)


# Runs in the page: what a reader would notice.
PAGE_CHECK = """(() => {
  const out = {sections: [...document.querySelectorAll("body > section[id], body > header[id]")]
                 .map(s => s.id), misaligned: [], images: [], tables: 0};
  for (const table of document.querySelectorAll("table")) {
    out.tables += 1;
    const head = table.tHead && table.tHead.rows[0];
    if (!head) { out.misaligned.push({table: table.className, problem: "no header row"}); continue; }
    const width = r => [...r.cells].reduce((n, c) => n + (c.colSpan || 1), 0);
    const want = width(head);
    for (const body of table.tBodies) for (const row of body.rows) {
      if (width(row) !== want) out.misaligned.push({table: table.className || table.id,
        header: [...head.cells].map(c => c.textContent), got: width(row), want: want,
        row: row.textContent.slice(0, 200)});
    }
  }
  for (const img of document.images)
    out.images.push({alt: img.alt, complete: img.complete, width: img.naturalWidth});
  out.links = [...document.querySelectorAll("td.files a")].map(a => a.getAttribute("href"));
  out.height = document.documentElement.scrollHeight;
  return JSON.stringify(out);
})()"""

# Sort the cells table by step median, then filter it.
INTERACT = """(() => {
  const table = document.getElementById("cells-table");
  const col = [...table.tHead.rows[0].cells].findIndex(c => c.textContent.startsWith("step median"));
  const values = () => [...table.tBodies[0].rows].map(r => r.cells[col].getAttribute("data-sort"))
                        .filter(v => v !== "").map(Number);
  table.tHead.rows[0].cells[col].click();
  const ascending = values();
  table.tHead.rows[0].cells[col].click();
  const descending = values();
  const box = document.getElementById("cell-filter");
  box.value = "fp64"; box.dispatchEvent(new Event("input"));
  const shown = [...table.tBodies[0].rows].filter(r => !r.hidden).map(r => r.cells[0].textContent);
  const count = document.getElementById("cell-count").textContent;
  box.value = ""; box.dispatchEvent(new Event("input"));
  const only = document.getElementById("cell-attention");
  only.checked = true; only.dispatchEvent(new Event("change"));
  const attention = [...table.tBodies[0].rows].filter(r => !r.hidden).map(r => r.cells[0].textContent);
  return JSON.stringify({ascending, descending, shown, count, attention});
})()"""


def browser_run(tmp_path: Path) -> Path:
    """A run folder with results.json and each launched cell's files, as the
    launcher leaves them: a probe, ok / skipped / error cells, a profiled cell
    with traces, checks against a baseline."""
    real = os.environ.get("PERFSUITE_BROWSER_RUN")
    folder = tmp_path / "run"
    folder.mkdir()
    if real:
        for name in ("cells", "preflight"):  # the links resolve to the real files
            if (Path(real) / name).is_dir():
                (folder / name).symlink_to((Path(real) / name).resolve(), target_is_directory=True)
        shutil.copy(Path(real) / "results.json", folder / "results.json")
        return folder
    base, current = profile_pair()
    regressed = {"name": "step_time", "verdict": "regressed", "observed": 0.2, "expected": 0.1,
                 "ratio": 2.0, "ci_low": 1.8, "ci_high": 2.2, "confidence": 0.95, "tolerance": 0.05,
                 "metric": "step_time", "unit": "s", "baseline": "recorded run", "message": "slower"}
    same = {**regressed, "verdict": "same", "observed": 0.1, "ratio": 1.02, "ci_low": 0.95,
            "ci_high": 1.1, "tolerance": 0.5, "message": "<same>"}
    rss = {"name": "peak_rss", "verdict": "same", "observed": 2**30, "expected": 1.04 * 2**30,
           "ratio": 0.96, "ci_low": 0.96, "ci_high": 0.96, "tolerance": 0.6, "metric": "peak_rss",
           "unit": "bytes", "baseline": "recorded run", "message": ""}
    cells = [cell(world_size=1, precision="fp32", step_s=0.10, checks=[same, rss]),
             cell(world_size=2, precision="fp32", step_s=0.12, checks=[same]),
             cell(world_size=1, precision="fp64", step_s=0.20),
             cell(world_size=2, precision="fp64", step_s=0.24),
             cell(world_size=2, pin=True, step_s=0.11, checks=[regressed], profile=current.to_dict(),
                  info={"pin_memory_effective": False}),
             cell(world_size=4, status="skipped", reason="needs 4 ranks; <only 2 cores>"),
             cell(strategy="ddp-rr", world_size=2, status="error", reason="rank 1 failed",
                  output_tail="Traceback ...\nRuntimeError: <boom>"),
             cell(workload="llm", strategy="lora", dataset="alpaca", world_size=1, step_s=0.05),
             cell(workload="llm", strategy="qlora", dataset="alpaca", world_size=1, step_s=0.07)]
    cells[0]["params"]["min_accuracy"] = 0.9  # only this one has an accuracy target
    for c in cells:
        if c["status"] != "skipped":
            c["dir"] = str(folder / "cells" / c["id"])
            Path(c["dir"]).mkdir(parents=True)
            (Path(c["dir"]) / "output.log").write_text("log\n")
            (Path(c["dir"]) / "result.json").write_text("{}")
    (Path(cells[4]["dir"]) / "profile").mkdir()
    for rank in (0, 1):
        (Path(cells[4]["dir"]) / "profile" / f"rank{rank}.trace.json").write_text("{}")
    results = run(cells)
    results["probe"] = {"id": "smoke/probe/c2", "status": "ok",
                        "metrics": {"matmul_tflops_fp32": {"value": 0.126, "unit": "TFLOP/s"},
                                    "allreduce_busbw_gbps": {"value": 0.86, "unit": "GB/s"}},
                        "assessment": {"trusted": True, "flags": [], "notes": ["no reference"],
                                       "figures": {}}}
    (folder / "results.json").write_text(json.dumps(results))
    return folder


@pytest.fixture(scope="module")
def browser():
    return require_browser()


def open_and_check(devtools: DevTools, page: Path) -> tuple[str, dict]:
    """Load ``page`` in a new tab; its session and what PAGE_CHECK found."""
    target = devtools.send("Target.createTarget", {"url": "about:blank"})["targetId"]
    session = devtools.send("Target.attachToTarget", {"targetId": target, "flatten": True})["sessionId"]
    for domain in ("Page", "Runtime", "Log"):
        devtools.send(f"{domain}.enable", session=session)
    devtools.send("Page.navigate", {"url": page.resolve().as_uri()}, session=session)
    devtools.wait_for("Page.loadEventFired", session)
    found = json.loads(devtools.send("Runtime.evaluate", {"expression": PAGE_CHECK, "returnByValue": True},
                                     session=session)["result"]["value"])
    return session, found


def console_errors(devtools: DevTools, session: str) -> list[dict]:
    return [e for e in devtools.events if e.get("sessionId") == session and (
        (e.get("method") == "Runtime.consoleAPICalled" and e["params"]["type"] in ("error", "assert"))
        or e.get("method") == "Runtime.exceptionThrown"
        or (e.get("method") == "Log.entryAdded" and e["params"]["entry"]["level"] == "error"))]


def test_report_renders_in_chromium(browser, tmp_path):
    folder = browser_run(tmp_path)
    page = html.write_reports(folder)["report_html"]
    devtools = DevTools(browser, tmp_path / "chromium-profile")
    try:
        session, found = open_and_check(devtools, page)
        height = min(int(found["height"]), 16000)
        devtools.send("Emulation.setDeviceMetricsOverride", {"width": 1400, "height": height,
                                                            "deviceScaleFactor": 1, "mobile": False},
                      session=session)
        shot = devtools.send("Page.captureScreenshot", {"format": "png"}, session=session)
        screenshot = tmp_path / "report.png"
        screenshot.write_bytes(base64.b64decode(shot["data"]))
        print(f"\nreport: {page}\nscreenshot: {screenshot}")
        acted = json.loads(devtools.send("Runtime.evaluate", {"expression": INTERACT,
                                                              "returnByValue": True},
                                         session=session)["result"]["value"])
        time.sleep(0.1)  # let late console messages arrive
        devtools.send("Runtime.evaluate", {"expression": "1"}, session=session)
    finally:
        devtools.close()
    problems = console_errors(devtools, session)
    assert problems == [], f"console errors: {problems}"
    wanted = SECTIONS if not os.environ.get("PERFSUITE_BROWSER_RUN") else tuple(
        s for s in SECTIONS if s != "skipped")
    assert [s for s in wanted if s not in found["sections"]] == [], found["sections"]
    assert found["misaligned"] == [], json.dumps(found["misaligned"], indent=1)[:3000]
    assert found["tables"] >= 5
    assert len(found["images"]) >= 4, "figures missing"
    broken = [i for i in found["images"] if not i["complete"] or i["width"] <= 0]
    assert broken == [], f"images that did not load: {broken}"
    assert screenshot.read_bytes().startswith(b"\x89PNG") and screenshot.stat().st_size > 10_000
    for href in found["links"]:  # relative, and they resolve to files next to the page
        assert not href.startswith(("/", "file:", "http")), href
        assert (page.parent / unquote(href)).exists(), href
    assert acted["ascending"] == sorted(acted["ascending"])
    assert acted["descending"] == sorted(acted["descending"], reverse=True)
    if not os.environ.get("PERFSUITE_BROWSER_RUN"):
        assert any(h.endswith("profile/rank1.trace.json") for h in found["links"])
        assert acted["shown"] and all("fp64" in s for s in acted["shown"]), acted
        assert acted["count"] == f"{len(acted['shown'])} of 9 cells"
        assert {s.split("/")[2] for s in acted["attention"]} == {"ddp-ds", "ddp-rr"}, acted


def test_a_missing_browser_fails_under_ci_and_skips_elsewhere(monkeypatch):
    monkeypatch.setenv("PERFSUITE_CHROMIUM", "no-such-chromium-binary")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI is set and no Chromium binary found"):
        require_browser()
    for unset in ("", "false"):
        monkeypatch.setenv("CI", unset)
        with pytest.raises(pytest.skip.Exception, match="apt-get install -y chromium"):
            require_browser()
