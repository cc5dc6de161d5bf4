"""`herald watch`: the terminal client on HeraldClient. Its events are JSON
lines on stdout, its commands come on stdin and are answered on stdout; what
it does reaches the user's other devices (docs/CLIENT-SWIFT.md)."""

from __future__ import annotations

import json
import queue
import subprocess
import threading
import time
from typing import Callable

from herald_helpers import FRAME_WAIT, changes_in, mint_token

LINE_WAIT = 30.0   # a debug build on a loaded machine: connect, catch up, answer


class Watch:
    """One `herald watch` process; its stdout lines, parsed, in order."""

    def __init__(self, herald_bin, gateway, token: str | None, device: str, state, token_file=None):
        given = ["--token", token] if token_file is None else ["--token-file", str(token_file)]
        self.proc = subprocess.Popen(
            [str(herald_bin), "watch", "--url", gateway.base, *given, "--device", device,
             "--platform", "other", "--tags", "lang:en,team:ops", "--state", str(state)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        self.lines: queue.Queue = queue.Queue()
        self.seen: list[dict] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for raw in iter(self.proc.stdout.readline, b""):
            self.lines.put(json.loads(raw))   # every line must be JSON
        self.lines.put(None)

    def send(self, command: str) -> None:
        self.proc.stdin.write(command.encode() + b"\n")
        self.proc.stdin.flush()

    def expect(self, pred: Callable[[dict], bool], what: str, earlier: bool = False) -> dict:
        """The next line matching `pred` (lines before it are kept in `seen`);
        `earlier`: or one already seen."""
        if earlier:
            for line in self.seen:
                if pred(line):
                    return line
        deadline = time.monotonic() + LINE_WAIT
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no {what} within {LINE_WAIT}s; lines: {self.seen}")
            assert line is not None, f"watch ended before {what}: {self.proc.stderr.read()!r}; lines: {self.seen}"
            self.seen.append(line)
            if pred(line):
                return line

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.kill()
        return self.proc.wait(10)


def test_watch_prints_events_and_its_dismiss_reaches_the_other_device(herald_bin, gateway, user, tmp_path):
    laptop, _, _ = gateway.connect(user, "laptop", platform="web")
    watch = Watch(herald_bin, gateway, gateway.token(user), "terminal", tmp_path / "watch.db")
    try:
        with laptop:
            watch.expect(lambda l: l == {"event": "connection", "state": "live", "transport": "websocket"}, "live")
            n = gateway.publish(user, "deploy-1", payload={"title": "Deploy finished"})["notification"]
            got = watch.expect(lambda l: l.get("event") == "upserted", "the published notification")
            assert got == {"event": "upserted", "notification": n}
            watch.expect(lambda l: l == {"event": "unread", "count": 1}, "the unread count")
            laptop.expect_changes(1)

            watch.send(f"dismiss {n['id']}")
            reply = watch.expect(lambda l: "reply" in l, "the dismiss's answer")
            assert reply["reply"] == "dismiss" and reply["ok"] is True and reply["id"] == n["id"], reply
            assert reply["notification"]["userActionState"] == "dismissed"
            assert reply["notification"]["version"] == 2
            # The change reaches the laptop, and the watch itself (before or after the ack).
            frames = laptop.collect_until(
                lambda fs: any(c["op"] == "upsert" and c["notification"]["userActionState"] == "dismissed"
                               for c in changes_in(fs)), what="the dismiss", timeout=FRAME_WAIT)
            assert [c["notification"] for c in changes_in(frames)] == [reply["notification"]]
            watch.expect(lambda l: l.get("event") == "upserted" and l["notification"] == reply["notification"],
                         "the dismiss as a change", earlier=True)
            assert gateway.get_notification(user, n["id"])["userActionState"] == "dismissed"

            # `seen`: shown, not read (SPEC 11).
            m = gateway.publish(user, "deploy-2")["notification"]
            watch.expect(lambda l: l.get("event") == "upserted" and l["notification"]["id"] == m["id"], "the second one")
            watch.send(f"seen {m['id']}")
            reply = watch.expect(lambda l: "reply" in l, "the seen's answer")
            assert reply["reply"] == "seen" and reply["ok"] is True, reply
            assert reply["notification"]["seenState"] == "seen" and reply["notification"]["readState"] == "unread", reply
            assert gateway.get_notification(user, m["id"])["seenState"] == "seen"

            # `snooze ID +SECONDS`: until a time, which the gateway wakes it at (SPEC 11).
            watch.send(f"snooze {m['id']} +3")
            reply = watch.expect(lambda l: "reply" in l, "the snooze's answer")
            assert reply["ok"] is True and reply["notification"]["snoozedUntil"] is not None, reply
            watch.expect(lambda l: l.get("event") == "upserted" and l["notification"]["id"] == m["id"]
                         and l["notification"]["userActionState"] == "noInteraction"
                         and l["notification"]["seenState"] == "unseen", "the wake", earlier=True)
            for bad in (f"snooze {m['id']} +0", f"snooze {m['id']} soon", f"snooze {m['id']} +99999999999999999"):
                watch.send(bad)
                reply = watch.expect(lambda l: "reply" in l, f"the answer to {bad!r}")
                assert reply["ok"] is False and reply["error"]["code"] == "bad_command", reply

            # Errors are answers too; the watch goes on.
            watch.send("read n_nosuchnotification")
            reply = watch.expect(lambda l: "reply" in l, "the refused read's answer")
            assert reply == {"reply": "read", "id": "n_nosuchnotification", "ok": False,
                             "error": {"code": "not_found", "message": reply["error"]["message"]}}, reply
            watch.send("frobnicate")
            reply = watch.expect(lambda l: "reply" in l, "the unknown command's answer")
            assert reply["ok"] is False and reply["error"]["code"] == "bad_command", reply

            watch.send(f"delete {n['id']}")
            reply = watch.expect(lambda l: "reply" in l, "the delete's answer")
            assert reply == {"reply": "delete", "id": n["id"], "ok": True}, reply
            watch.expect(lambda l: l == {"event": "removed", "id": n["id"], "reason": "deleted"}, "the removal",
                         earlier=True)

            watch.send("quit")
            watch.expect(lambda l: l == {"reply": "quit", "ok": True}, "quit's answer")
            assert watch.proc.wait(10) == 0
    finally:
        watch.stop()
    assert (tmp_path / "watch.db").exists()


def test_a_token_file_is_read_again_when_the_token_runs_out(herald_bin, gateway, user, tmp_path):
    """`--token-file`: the watch asks the file whenever it needs a token, so
    renewing the file keeps it connected past the first token's exp."""
    lifetime = 8
    short_ends = time.time() + lifetime
    token_file = tmp_path / "token"
    token_file.write_text(mint_token(user, ttl=lifetime) + "\n")
    watch = Watch(herald_bin, gateway, None, "terminal", tmp_path / "watch.db", token_file=token_file)
    try:
        watch.expect(lambda l: l == {"event": "connection", "state": "live", "transport": "websocket"}, "live")
        token_file.write_text(gateway.token(user))
        # Past the first token's exp: the watch refreshed (or reconnected) with the file's new token.
        time.sleep(max(0.0, short_ends + 1 - time.time()))
        n = gateway.publish(user, "after-exp", payload={"title": "still here"})["notification"]
        got = watch.expect(lambda l: l.get("event") == "upserted", "the notification published after the exp")
        assert got == {"event": "upserted", "notification": n}
    finally:
        watch.stop()


def test_watch_prefs_shows_and_saves_the_users_preferences(herald_bin, gateway, user, tmp_path):
    """`prefs` answers the user's preferences; `prefs GROUP CHANNEL on|off`
    saves one switch, which reaches the user's other device and comes back
    to the watch as a `preferences` event (SPEC section 12)."""
    laptop, _, _ = gateway.connect(user, "laptop", platform="web")
    watch = Watch(herald_bin, gateway, gateway.token(user), "terminal", tmp_path / "watch.db")
    try:
        with laptop:
            watch.expect(lambda l: l.get("event") == "connection" and l.get("state") == "live", "live")
            watch.send("prefs")
            reply = watch.expect(lambda l: "reply" in l, "the prefs answer")
            assert reply["ok"] is True and reply["preferences"]["version"] == 0, reply
            watch.send("prefs marketing inbox off")
            reply = watch.expect(lambda l: "reply" in l, "the save's answer")
            assert reply["ok"] is True and reply["preferences"]["groups"] == {"marketing": {"inbox": False}}, reply
            [c], _ = laptop.expect_changes(1)
            assert c["op"] == "preferences" and c["preferences"] == reply["preferences"]
            watch.expect(lambda l: l.get("event") == "preferences" and l["preferences"] == reply["preferences"],
                         "the save as an event", earlier=True)
            r = gateway.publish_raw(user, {"appNotificationId": "ad", "payload": {}, "groupName": "marketing"})
            assert r.json()["suppressed"] == "preferences"
            watch.send("prefs marketing sms on")
            reply = watch.expect(lambda l: "reply" in l, "the bad prefs answer")
            assert reply["ok"] is False and reply["error"]["code"] == "bad_command", reply
    finally:
        watch.stop()
