import XCTest
import HeraldCore
import HeraldStores
@testable import HeraldGateway

/// `seenState` apart from `readState` (SPEC section 11), in-process: the
/// PATCH rules, `seen-all`, the history filter, counts, and the WebSocket's
/// `update`, `welcome` and `counts` frames.
final class SeenTests: XCTestCase {
    let me = "/v1/me"
    let server = "/v1/apps/\(Harness.app.id)/users/u"
    let user = UserKey(app: Harness.app.id, user: "u")

    /// Publishes `anid` for everyone, or only for `platforms`.
    func publish(_ h: Harness, _ anid: String, platforms: [String]? = nil) -> String {
        var body: JSONObject = ["appNotificationId": .string(anid), "payload": ["t": "x"]]
        if let platforms { body["targetPlatforms"] = .array(platforms.map(JSON.string)) }
        let r = h.request("POST", server + "/notifications", body: .object(body))
        h.settle()
        XCTAssertEqual(r.response?.status, 201)
        return r.json!["notification"]!.objectValue!["id"]!.stringValue!
    }

    func notification(_ h: Harness, _ id: String) -> JSONObject {
        let r = h.request("GET", server + "/notifications/\(id)")
        h.settle()
        return r.json!["notification"]!.objectValue!
    }

    func patch(_ h: Harness, _ path: String, token: String? = nil, _ body: JSON) -> RecordingResponder {
        let r = h.request("PATCH", path, token: token, body: body)
        h.settle()
        return r
    }

    func counts(_ h: Harness, _ tok: String, device: String? = nil) -> JSONObject? {
        let r = h.request("GET", me + "/counts", token: tok, device: device)
        h.settle()
        return r.json
    }

    /// A new notification is unseen; read makes it seen in the same change;
    /// unread again leaves it seen; by the device's PATCH and the server's.
    func testReadMakesItSeenInOneChangeAndUnreadLeavesItSeen() throws {
        let store = MemoryStore()
        let h = Harness(store: store)
        let tok = h.token("u")
        let a = publish(h, "a"), b = publish(h, "b")
        XCTAssertEqual(notification(h, a)["seenState"], "unseen")
        XCTAssertEqual(counts(h, tok), ["unread": 2, "unseen": 2, "noInteraction": 2, "total": 2])

        let head = try store.feed(user).head
        let read = patch(h, me + "/notifications/\(a)", token: tok, ["readState": "read"])
        XCTAssertEqual(read.response?.status, 200)
        let n = read.json!["notification"]!.objectValue!
        XCTAssertEqual(n["readState"], "read")
        XCTAssertEqual(n["seenState"], "seen")
        XCTAssertEqual(n["version"], 2, "one change")
        XCTAssertEqual(try store.feed(user).head, head + 1, "one change")
        XCTAssertEqual(counts(h, tok), ["unread": 1, "unseen": 1, "noInteraction": 2, "total": 2])

        let unread = patch(h, server + "/notifications/\(a)", ["readState": "unread"])
        XCTAssertEqual(unread.response?.status, 200)
        XCTAssertEqual(unread.json!["notification"]!.objectValue!["readState"], "unread")
        XCTAssertEqual(unread.json!["notification"]!.objectValue!["seenState"], "seen", "unread again leaves it seen")
        XCTAssertEqual(counts(h, tok), ["unread": 2, "unseen": 1, "noInteraction": 2, "total": 2])

        // Seen alone, by the server: still unread.
        let seen = patch(h, server + "/notifications/\(b)", ["seenState": "seen"])
        XCTAssertEqual(seen.json!["notification"]!.objectValue!["seenState"], "seen")
        XCTAssertEqual(seen.json!["notification"]!.objectValue!["readState"], "unread")
        XCTAssertEqual(counts(h, tok), ["unread": 2, "unseen": 0, "noInteraction": 2, "total": 2])

        // A no-op answers the current seq and makes no change.
        let headBefore = try store.feed(user).head
        let noop = patch(h, me + "/notifications/\(b)", token: tok, ["seenState": "seen"])
        XCTAssertEqual(noop.response?.status, 200)
        XCTAssertEqual(noop.json?.int("seq"), headBefore)
        XCTAssertEqual(try store.feed(user).head, headBefore)

        // Replacing resets it to unseen.
        _ = h.request("POST", server + "/notifications", body: ["appNotificationId": "b", "payload": ["t": "y"]])
        h.settle()
        XCTAssertEqual(notification(h, b)["seenState"], "unseen")
        XCTAssertEqual(counts(h, tok)?["unseen"], 1)
    }

    /// A bad seenState, or read with unseen, is 400 and changes nothing.
    func testABadSeenStateIs400AndChangesNothing() throws {
        let store = MemoryStore()
        let h = Harness(store: store)
        let tok = h.token("u")
        let a = publish(h, "a")
        let head = try store.feed(user).head
        for body: JSON in [["seenState": "maybe"], ["seenState": true], ["readState": "read", "seenState": "unseen"],
                           ["seenState": .null]] {
            for path in [me + "/notifications/\(a)", server + "/notifications/\(a)"] {
                let r = patch(h, path, token: path.hasPrefix(me) ? tok : nil, body)
                XCTAssertEqual(r.response?.status, 400, "\(body.encodedString) \(path)")
                XCTAssertEqual(r.json?["error"]?.objectValue?["code"], "bad_request")
            }
        }
        XCTAssertEqual(try store.feed(user).head, head)
        XCTAssertEqual(notification(h, a)["seenState"], "unseen")
        XCTAssertEqual(notification(h, a)["version"], 1)
    }

    /// seen-all marks every unseen notification the device may see seen,
    /// one change each, leaves readState alone and what it may not see
    /// unseen; other methods are 405.
    func testSeenAllMarksWhatTheDeviceMaySeeOneChangeEach() throws {
        let store = MemoryStore()
        let h = Harness(store: store)
        let tok = h.token("u")
        let reg = h.request("PUT", me + "/devices/d1", token: tok, body: ["platform": "web"])
        h.settle()
        XCTAssertEqual(reg.response?.status, 200)
        let ids = ["a", "b", "c"].map { publish(h, $0) }
        let iosOnly = publish(h, "ios", platforms: ["ios"])
        _ = patch(h, me + "/notifications/\(ids[0])", token: tok, ["seenState": "seen"])
        _ = patch(h, me + "/notifications/\(ids[1])", token: tok, ["readState": "read"])  // read, so seen

        let s = h.webSocket()
        h.hello(s, user: "u", device: "d1")
        h.settle(); s.read()
        let welcome = try XCTUnwrap(s.frames.last)
        XCTAssertEqual(welcome["type"], "welcome")
        XCTAssertEqual(welcome["unread"], 2)
        XCTAssertEqual(welcome["unseen"], 1)
        s.frames = []

        let head = try store.feed(user).head
        let all = h.request("POST", me + "/notifications/seen-all", token: tok, device: "d1")
        h.settle(); s.read()
        XCTAssertEqual(all.response?.status, 200)
        XCTAssertEqual(all.json, ["updated": 1, "seq": .int(head + 1)])
        XCTAssertEqual(try store.feed(user).head, head + 1, "one change each")
        XCTAssertEqual(changeSeqs(s.frames), [head + 1])
        XCTAssertEqual(s.frames.last, ["type": "counts", "unread": 2, "unseen": 0], "only unseen moved, and a counts frame says so")
        XCTAssertEqual(notification(h, ids[2])["seenState"], "seen")
        XCTAssertEqual(notification(h, ids[2])["readState"], "unread", "seen is not read")
        XCTAssertEqual(notification(h, iosOnly)["seenState"], "unseen", "a notification the device may not see stays unseen")
        XCTAssertEqual(counts(h, tok, device: "d1"), ["unread": 2, "unseen": 0, "noInteraction": 3, "total": 3])
        XCTAssertEqual(counts(h, tok)?["unseen"], 1)

        // Again: nothing left to mark, no change.
        let again = h.request("POST", me + "/notifications/seen-all", token: tok, device: "d1")
        h.settle()
        XCTAssertEqual(again.json, ["updated": 0, "seq": .int(head + 1)])
        // An unnamed client sees everything.
        let unnamed = h.request("POST", me + "/notifications/seen-all", token: tok)
        h.settle()
        XCTAssertEqual(unnamed.json?["updated"], 1)
        XCTAssertEqual(notification(h, iosOnly)["seenState"], "seen")

        for method in ["GET", "PUT", "PATCH", "DELETE"] {
            let r = h.request(method, me + "/notifications/seen-all", token: tok)
            h.settle()
            XCTAssertEqual(r.response?.status, 405, method)
            XCTAssertEqual(r.response?.header("Allow"), "POST", method)
        }
    }

    /// History takes seenState=unseen|seen, for the device and the server;
    /// another value is 400.
    func testHistoryFiltersBySeenState() throws {
        let store = MemoryStore()
        let h = Harness(store: store)
        let tok = h.token("u")
        let a = publish(h, "a"), b = publish(h, "b"), c = publish(h, "c")
        _ = patch(h, server + "/notifications/\(a)", ["seenState": "seen"])
        _ = patch(h, server + "/notifications/\(c)", ["readState": "read"])
        func ids(_ path: String, _ query: [(String, String)], token: String? = nil) -> [String]? {
            let r = h.request("GET", path, token: token, query: query)
            h.settle()
            return r.json?["notifications"]?.arrayValue?.map { $0.objectValue!["id"]!.stringValue! }
        }
        for (path, t) in [(me + "/notifications", tok), (server + "/notifications", nil)] {
            XCTAssertEqual(ids(path, [("seenState", "unseen")], token: t), [b], path)
            XCTAssertEqual(ids(path, [("seenState", "seen")], token: t), [c, a], path)
            XCTAssertEqual(ids(path, [("seenState", "seen"), ("readState", "unread")], token: t), [a], path)
            XCTAssertEqual(ids(path, [], token: t), [c, b, a], path)
            for bad in ["read", "", "Seen", "unseen,seen"] {
                let r = h.request("GET", path, token: t, query: [("seenState", bad)])
                h.settle()
                XCTAssertEqual(r.response?.status, 400, "\(path) \(bad)")
            }
        }
    }

    /// A WebSocket `update` takes seenState; the counts frame carries
    /// unseen and comes when unread or unseen moved, not otherwise.
    func testWebSocketUpdateWithSeenStateAndItsCountsFrames() throws {
        let h = Harness()
        let a = publish(h, "a"), b = publish(h, "b")
        let s = h.webSocket()
        h.hello(s, user: "u")
        h.settle(); s.read()
        XCTAssertEqual(s.frames.last?["unread"], 2)
        XCTAssertEqual(s.frames.last?["unseen"], 2)
        func update(_ ref: String, _ id: String, _ fields: JSONObject) -> [JSONObject] {
            s.frames = []
            var o: JSONObject = ["type": "update", "ref": .string(ref), "id": .string(id)]
            for (k, v) in fields.pairs { o[k] = v }
            s.session.receive(.text(JSON.object(o).encoded))
            h.settle(); s.read()
            return s.frames
        }

        var frames = update("c1", a, ["seenState": "seen"])
        let ack = try XCTUnwrap(frames.first { $0["type"] == "ack" })
        XCTAssertEqual(ack["notification"]?.objectValue?["seenState"], "seen")
        XCTAssertEqual(ack["notification"]?.objectValue?["readState"], "unread")
        XCTAssertEqual(frames.filter { $0["type"] == "counts" }, [["type": "counts", "unread": 2, "unseen": 1]])

        frames = update("c2", b, ["readState": "read"])
        XCTAssertEqual(frames.first { $0["type"] == "ack" }?["notification"]?.objectValue?["seenState"], "seen")
        XCTAssertEqual(changeSeqs(frames).count, 1, "read and seen in one change")
        XCTAssertEqual(frames.filter { $0["type"] == "counts" }, [["type": "counts", "unread": 1, "unseen": 0]])

        frames = update("c3", b, ["readState": "unread"])
        XCTAssertEqual(frames.filter { $0["type"] == "counts" }, [["type": "counts", "unread": 2, "unseen": 0]])

        frames = update("c4", a, ["userActionState": "dismissed"])
        XCTAssertEqual(changeSeqs(frames).count, 1)
        XCTAssertEqual(frames.filter { $0["type"] == "counts" }, [], "neither count moved")

        frames = update("c5", a, ["seenState": "seen"])
        XCTAssertEqual(frames.map { $0["type"] }, ["ack"], "a no-op: its ack only")

        frames = update("c6", a, ["seenState": "maybe"])
        XCTAssertEqual(frames.first?["type"], "error")
        XCTAssertEqual(frames.first?["code"], "bad_request")
        frames = update("c7", a, ["readState": "read", "seenState": "unseen"])
        XCTAssertEqual(frames.first?["code"], "bad_request")
        XCTAssertEqual(notification(h, a)["seenState"], "seen")
    }
}
