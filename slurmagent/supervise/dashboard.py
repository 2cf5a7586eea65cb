"""`slurmagent dashboard`: the sweep's report served on loopback while it runs. Each request of
the page gets a "Now" section built from the sweep's state and each running task's progress
(cheap: a few small files), in front of the report's plots and tables, which are written again
at most every `every_s` seconds (matplotlib is the costly part); the page reloads itself. The
server reads the sweep's files only: it never polls Slurm or acts on the sweep."""

from __future__ import annotations

import html
import logging
import threading
import time
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from slurmagent.supervise.report import write_report
from slurmagent.supervise.state import SweepStore
from slurmagent.supervise.views import progress, progress_text, runs_text, study_line, summary_line

log = logging.getLogger(__name__)

CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".png": "image/png", ".csv": "text/csv; charset=utf-8"}
MARK = "<h1"  # the live section goes in before the report's title


def now_section(sweep_dir: Path) -> str:
    """The sweep as it is at this moment: its counts, and every task's state, runs and progress."""
    e = html.escape
    state = SweepStore(sweep_dir).view()
    rows = []
    for t in sorted(state.tasks, key=lambda t: t.index):
        p = progress(state, t) if t.state == "RUNNING" else None
        detail = progress_text(p) if p is not None else (t.error.splitlines()[0] if t.error else "")
        cells = (str(t.index), t.state, runs_text(t), detail)
        rows.append(f'<tr id="task-{t.index}">' + "".join(f"<td>{e(c)}</td>" for c in cells) + "</tr>")
    search = study_line(sweep_dir)
    return (
        f'<section id="now"><h2>Now ({e(time.strftime("%H:%M:%S"))})</h2>'
        f"<p>{e(summary_line(state))}</p>" + (f"<p>{e(search)}</p>" if search else "") + "<table><thead><tr>"
        "<th>#</th><th>state</th><th>runs</th><th>progress / reason</th></tr></thead><tbody>"
        + "".join(rows)
        + "</tbody></table></section>"
    )


class Dashboard:
    """The report of `sweep_dir` under `out`, rewritten when a page is asked for and the last
    write is older than `every_s`; served with the live section by `serve`."""

    def __init__(self, sweep_dir: Path, out: Path, every_s: float = 10.0) -> None:
        self.sweep_dir = sweep_dir
        self.out = out
        self.every_s = every_s
        self._written = -float("inf")
        self._lock = threading.Lock()

    def page(self) -> str:
        with self._lock:  # one write at a time; the others wait for it and read what it wrote
            if time.monotonic() - self._written >= self.every_s:
                write_report(self.sweep_dir, self.out)
                self._written = time.monotonic()
            body = (self.out / "index.html").read_text()
        live = now_section(self.sweep_dir)
        refresh = f'<meta http-equiv="refresh" content="{max(2, round(self.every_s))}">'
        body = body.replace("<head>", "<head>" + refresh, 1)
        at = body.find(MARK)
        return body[:at] + live + body[at:] if at >= 0 else live + body

    def server(self, port: int) -> ThreadingHTTPServer:
        dashboard = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                name = self.path.split("?", 1)[0].lstrip("/") or "index.html"
                try:
                    if name == "index.html":
                        data = dashboard.page().encode()
                    elif "/" in name or name.startswith(".") or Path(name).suffix not in CONTENT_TYPES:
                        self.send_error(HTTPStatus.NOT_FOUND)
                        return
                    else:
                        data = (dashboard.out / name).read_bytes()
                except FileNotFoundError:
                    self.send_error(HTTPStatus.NOT_FOUND)
                    return
                self.send_response(HTTPStatus.OK)
                self.send_header("Content-Type", CONTENT_TYPES[Path(name).suffix])
                self.send_header("Content-Length", str(len(data)))
                self.send_header("Cache-Control", "no-store")
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, format: str, *args: object) -> None:
                log.debug("dashboard: " + format, *args)

        return ThreadingHTTPServer(("127.0.0.1", port), Handler)  # loopback only: reached through a tunnel
