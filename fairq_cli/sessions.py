"""`fairq session start|list|open|stop`: notebook sessions through `/api/v1/sessions/`
(docs/cli.md, "Notebook sessions"). The CLI never sees a server's token: `open` prints
fairq's own URL of the session's JupyterLab, which the browser opens with your login."""

from __future__ import annotations

import argparse
from typing import Any

from .durations import DURATION_HELP, format_duration, parse_duration


class SessionUsage(ValueError):
    """A bad flag, said the way `fairq` says usage errors."""


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    se = sub.add_parser("session", parents=[common],
                        help="interactive notebook sessions: start, list, open, stop")
    ss = se.add_subparsers(dest="session_cmd", required=True, metavar="ACTION")
    st = ss.add_parser("start", parents=[common],
                       help="start a JupyterLab session (it queues like a job)")
    st.add_argument("-t", "--team")
    st.add_argument("-J", "--name")
    st.add_argument("-i", "--image", help="default: the platform's notebook image")
    st.add_argument("-G", "--gpu-type", dest="gpu_type",
                    help="default: a type that shares GPUs in slices, if there is one")
    st.add_argument("-g", "--gpus", type=int, help="whole GPUs")
    st.add_argument("--fraction", help="a fraction of one GPU of a time-sliced or MPS type: "
                    "1/4, 0.5 (no memory isolation)")
    st.add_argument("--pvc", help="a PVC of your team as the notebook's root (kept after)")
    st.add_argument("--idle", help=f"stop after this long idle ({DURATION_HELP}; whole "
                    "minutes)")
    st.add_argument("--time", help=f"its time limit ({DURATION_HELP})")
    ls = ss.add_parser("list", parents=[common], help="your sessions")
    ls.add_argument("-A", "--all", action="store_true",
                    help="every session of your teams, not only yours")
    op = ss.add_parser("open", parents=[common], help="print the URL of a session's notebook")
    op.add_argument("session_id", type=int, metavar="ID")
    sp = ss.add_parser("stop", parents=[common], help="stop sessions (the PVC is kept)")
    sp.add_argument("session_ids", type=int, nargs="+", metavar="ID")


def start_body(a: argparse.Namespace) -> dict[str, Any]:
    body: dict[str, Any] = {}
    for flag, field in (("team", "team"), ("name", "name"), ("image", "image"),
                        ("gpu_type", "gpu_type"), ("gpus", "gpus"), ("fraction", "gpu_fraction"),
                        ("pvc", "pvc")):
        value = getattr(a, flag)
        if value not in (None, ""):
            body[field] = value
    try:
        if a.idle:
            seconds = parse_duration(a.idle)
            if seconds % 60:
                raise SessionUsage(f"--idle {a.idle}: whole minutes (60m, 2h)")
            body["idle_minutes"] = seconds // 60
        if a.time:
            body["max_runtime_seconds"] = parse_duration(a.time)
    except ValueError as exc:
        raise SessionUsage(str(exc)) from exc
    return body


def server_root(api_base: str) -> str:
    return api_base[: -len("/api/v1")] if api_base.endswith("/api/v1") else api_base


def idle_text(s: dict[str, Any]) -> str:
    if s["state"] != "RUNNING":
        return "-"
    text = f"{s['idle_minutes']}m/{s['idle_limit_minutes']}m"
    return text + (" WARNED" if s.get("warned_at") else "")


def run(app: Any, a: argparse.Namespace) -> int:
    """One `fairq session` action; 0, or the CLI's exit codes (1: the server said no)."""
    from .main import EXIT_SERVER_SAID_NO, table

    if a.session_cmd == "start":
        s = app.client.post("/sessions/", start_body(a))
        if app.as_json:
            app.emit_json(s)
            return 0
        warn = "" if s["memory_isolated"] else (
            f" (shared GPU, {s['sharing']}: no memory isolation)")
        app.say(f"Started session {s['id']} ({s['team']}/{s['name']}): {s['gpu']}{warn}, "
                f"{s['state']}; stopped after {s['idle_limit_minutes']} idle minutes, "
                f"time limit {format_duration(int(s['max_runtime_seconds'] or 0))}.")
        app.say(f"Open it with: fairq session open {s['id']}")
        return 0
    if a.session_cmd == "list":
        rows = app.client.get("/sessions/", all="true" if a.all else None)
        if app.as_json:
            app.emit_json(rows)
            return 0
        app.say(table([[s["id"], s["team"], s["name"], s["state"], s["gpu"],
                        format_duration(int(s["age_seconds"])), idle_text(s),
                        f"{s['cost']} {s['currency']}" if s["cost"] is not None
                        else f"{s['gpu_hours']:.2f} GPU-h",
                        s["url"] or "-"] for s in rows],
                      ["ID", "TEAM", "NAME", "STATE", "GPU", "AGE", "IDLE", "COST", "URL"]))
        return 0
    if a.session_cmd == "open":
        s = app.client.get(f"/sessions/{a.session_id}/")
        if s["state"] != "RUNNING" or not s["url"]:
            app.err.write(f"fairq: session {s['id']} is {s['state']}: no notebook to open"
                          f"{' yet' if s['state'] in ('QUEUED', 'ADMITTED') else ''}\n")
            return EXIT_SERVER_SAID_NO
        url = server_root(app.client.base) + s["url"]
        if app.as_json:
            app.emit_json({"id": s["id"], "url": url, "ready": s["ready"]})
        else:
            app.say(url)
            if not s["ready"]:
                app.err.write("fairq: its server is starting; the page answers in a moment\n")
        return 0
    return int(app.each(a.session_ids, "session",
                    lambda sid: app.client.request("DELETE", f"/sessions/{sid}/"),
                    lambda s: f"Stopped session {s['id']} ({s['name']}); its PVC and files "
                              "are kept"))
