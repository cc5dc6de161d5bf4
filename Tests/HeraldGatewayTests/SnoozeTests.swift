import HeraldPorts
import XCTest
import HeraldCore
import HeraldStores
@testable import HeraldGateway

/// Snoozes that end (SPEC section 11), in-process with a manual clock: the
/// PATCH and `update` rules, and the wake that maintenance sweeps, live and
/// on resume.
final class SnoozeTests: XCTestCase {
    let me = "/v1/me"
    let server = "/v1/apps/\(Harness.app.id)/users/u"
    let user = UserKey(app: Harness.app.id, user: "u")

    func publish(_ h: Harness, _ anid: String) -> String {
        let r = h.request("POST", server + "/notifications", body: ["appNotificationId": .string(anid), "payload": ["t": "x"]])
        h.settle()
        XCTAssertEqual(r.response?.status, 201)
        return r.json!["notification"]!.objectValue!["id"]!.stringValue!
    }

    func patch(_ h: Harness, _ id: String, token: String, _ body: JSON) -> RecordingResponder {
        let r = h.request("PATCH", me + "/notifications/\(id)", token: token, device: "d1", body: body)
        h.settle()
        return r
    }

    func time(_ ms: Millis) -> JSON { .string(RFC3339.format(ms)) }

    /// Snoozed until a time, the notification wakes at the first sweep
    /// after it: one upsert, back as new, to the connected device live and
    /// to a resuming one from its cursor.
    func testASnoozeUntilATimeWakesLiveAndOnResume() throws {
        let store = MemoryStore()
        let h = Harness(store: store)
        let tok = h.token("u")
        let id = publish(h, "a")
        _ = patch(h, id, token: tok, ["readState": "read"])
        let cursor = try store.feed(user).head
        let other = h.webSocket()
        h.hello(other, user: "u", device: "d2", cursor: cursor)
        h.settle(); other.read(); other.frames = []

        let until = h.clock.now() + 60_000
        let snooze = patch(h, id, token: tok, ["userActionState": "snoozed", "snoozedUntil": time(until)])
        XCTAssertEqual(snooze.response?.status, 200)
        let snoozed = try XCTUnwrap(snooze.json?["notification"]?.objectValue)
        XCTAssertEqual(snoozed["userActionState"], "snoozed")
        XCTAssertEqual(snoozed["snoozedUntil"], time(until))
        other.read()
        XCTAssertEqual(other.frames.last?["change"]?.objectValue?["notification"]?.objectValue?["snoozedUntil"], time(until))
        other.frames = []

        // Not before its time.
        h.clock.advance(millis: 59_000)
        h.gateway.soleEngine.runMaintenance()
        h.settle(); other.read()
        XCTAssertEqual(changeSeqs(other.frames), [], "still snoozed")

        h.clock.advance(millis: 1_000)
        h.gateway.soleEngine.runMaintenance()
        h.settle(); other.read()
        XCTAssertEqual(changeSeqs(other.frames).count, 1, "one change")
        let change = try XCTUnwrap(other.frames.first { $0["type"] == "change" }?["change"]?.objectValue)
        XCTAssertEqual(change["op"], "upsert")
        let woken = try XCTUnwrap(change["notification"]?.objectValue)
        XCTAssertEqual(woken["userActionState"], "noInteraction")
        XCTAssertEqual(woken["readState"], "unread")
        XCTAssertEqual(woken["seenState"], "unseen")
        XCTAssertEqual(woken["snoozedUntil"], .null)
        XCTAssertEqual(woken["version"], .int(snoozed.int("version")! + 1))
        XCTAssertEqual(woken["updatedAt"], time(h.clock.now()))
        XCTAssertEqual(other.frames.last { $0["type"] == "counts" }?["unread"], 1, "the badge counts it again")

        // A device resuming from before the snooze gets the woken state.
        let sync = h.request("GET", me + "/sync", token: tok, device: "d3", query: [("cursor", String(cursor))])
        h.settle()
        let changes = try XCTUnwrap(sync.json?["changes"]?.arrayValue)
        XCTAssertEqual(changes.last?.objectValue?["notification"]?.objectValue?["userActionState"], "noInteraction")
        XCTAssertEqual(changes.last?.objectValue?.int("seq"), change.int("seq"))

        // Once woken it is due no more: another sweep changes nothing.
        let head = try store.feed(user).head
        h.clock.advance(seconds: 5)
        h.gateway.soleEngine.runMaintenance()
        h.settle()
        XCTAssertEqual(try store.feed(user).head, head)
    }

    /// Another action before the time cancels the wake; a snooze's time
    /// moves alone; snoozed without a time never wakes.
    func testAnotherActionCancelsTheWakeAndTheTimeMoves() throws {
        let store = MemoryStore()
        let h = Harness(store: store)
        let tok = h.token("u")
        let a = publish(h, "a"), b = publish(h, "b"), c = publish(h, "c")
        let t = h.clock.now()
        for id in [a, b] {
            XCTAssertEqual(patch(h, id, token: tok, ["userActionState": "snoozed", "snoozedUntil": time(t + 10_000)]).response?.status, 200)
        }
        XCTAssertEqual(patch(h, c, token: tok, ["userActionState": "snoozed"]).response?.status, 200)
        let dismissed = patch(h, a, token: tok, ["userActionState": "dismissed"])
        XCTAssertEqual(dismissed.json?["notification"]?.objectValue?["snoozedUntil"], .null)
        let moved = patch(h, b, token: tok, ["snoozedUntil": time(t + 20_000)])
        XCTAssertEqual(moved.response?.status, 200)
        XCTAssertEqual(moved.json?["notification"]?.objectValue?["snoozedUntil"], time(t + 20_000))
        XCTAssertEqual(moved.json?["notification"]?.objectValue?["userActionState"], "snoozed")

        h.clock.advance(seconds: 15)
        h.gateway.soleEngine.runMaintenance()
        h.settle()
        XCTAssertEqual(try store.notification(user, id: a)?.userActionState, .dismissed, "not woken: dismissed since")
        XCTAssertEqual(try store.notification(user, id: b)?.userActionState, .snoozed, "its time moved")
        h.clock.advance(seconds: 5)
        h.gateway.soleEngine.runMaintenance()
        h.settle()
        XCTAssertEqual(try store.notification(user, id: b)?.userActionState, .noInteraction)
        XCTAssertEqual(try store.notification(user, id: c)?.userActionState, .snoozed, "no time: snoozed until changed")
    }

    /// Every refusal is a 400 that changes nothing, over HTTP and WebSocket.
    func testBadSnoozesAre400AndChangeNothing() throws {
        let store = MemoryStore()
        let h = Harness(store: store)
        let tok = h.token("u")
        let id = publish(h, "a")
        let now = h.clock.now()
        let head = try store.feed(user).head
        let bad: [JSONObject] = [
            ["userActionState": "snoozed", "snoozedUntil": time(now)],
            ["userActionState": "snoozed", "snoozedUntil": time(now - 1_000)],
            ["userActionState": "snoozed", "snoozedUntil": time(now + StateUpdate.maxSnoozeMillis + 1_000)],
            ["snoozedUntil": time(now + 60_000)],  // not snoozed
            ["userActionState": "dismissed", "snoozedUntil": time(now + 60_000)],
            ["userActionState": "snoozed", "snoozedUntil": "in an hour"],
            ["userActionState": "snoozed", "snoozedUntil": .int(now + 60_000)],
        ]
        for body in bad {
            let r = patch(h, id, token: tok, .object(body))
            XCTAssertEqual(r.response?.status, 400, "\(body)")
            XCTAssertEqual(r.json?["error"]?.objectValue?["code"], "bad_request", "\(body)")
        }
        let s = h.webSocket()
        h.hello(s, user: "u", device: "d1")
        h.settle(); s.read(); s.frames = []
        for (i, body) in bad.enumerated() {
            var o: JSONObject = ["type": "update", "ref": .string("r\(i)"), "id": .string(id)]
            for (k, v) in body.pairs { o[k] = v }
            s.session.receive(.text(JSON.object(o).encoded))
        }
        h.settle(); s.read()
        XCTAssertEqual(s.frames.filter { $0["type"] == "error" }.count, bad.count, "\(s.frames)")
        XCTAssertEqual(try store.feed(user).head, head, "nothing changed")
        XCTAssertEqual(try store.notification(user, id: id)?.version, 1)

        // The same snooze over WebSocket, well formed, is acknowledged.
        s.frames = []
        s.session.receive(.text(JSON.object(["type": "update", "ref": "ok", "id": .string(id), "userActionState": "snoozed",
                                             "snoozedUntil": time(now + 60_000)]).encoded))
        h.settle(); s.read()
        let ack = try XCTUnwrap(s.frames.first { $0["type"] == "ack" })
        XCTAssertEqual(ack["notification"]?.objectValue?["snoozedUntil"], time(now + 60_000))
    }
}
