import HeraldPorts
import XCTest
import HeraldCore
import HeraldStores
@testable import HeraldGateway

/// Preferences (SPEC section 12) in-process: the routes, a save reaching
/// every device, resets carrying them, and their effect on publishes and
/// pushes, critical groups ignoring them.
final class PreferencesTests: XCTestCase {
    static let app = AppConfig(id: "app.test", serverKey: "sk", tokenSecret: "ts", push: PushOutboxTests.push,
                               criticalGroups: ["security"])
    let server = "/v1/apps/\(PreferencesTests.app.id)/users/u"
    let user = UserKey(app: PreferencesTests.app.id, user: "u")
    let store = MemoryStore()
    let transport = HeldPushes()
    var h: Harness!

    override func setUp() { h = Harness(store: store, apps: [Self.app], push: transport) }

    func put(_ body: JSON, token: String? = nil, ifMatch: String? = nil, path: String? = nil) -> RecordingResponder {
        let r = h.request("PUT", path ?? server + "/preferences", token: token, body: body,
                          headers: ifMatch.map { ["if-match": $0] } ?? [:])
        h.settle()
        return r
    }

    func get(token: String? = nil) -> JSONObject? {
        let r = h.request("GET", token == nil ? server + "/preferences" : "/v1/me/preferences", token: token)
        h.settle()
        return r.json?["preferences"]?.objectValue
    }

    func publish(_ anid: String, group: String?) -> RecordingResponder {
        var body: JSONObject = ["appNotificationId": .string(anid), "payload": ["title": "t", "body": "b"]]
        if let group { body["groupName"] = .string(group) }
        let r = h.request("POST", server + "/notifications", body: .object(body))
        h.settle()
        return r
    }

    func testUnsavedPreferencesAnswerTheDefaultsAndTheAppsCriticalGroups() {
        let expected: JSONObject = ["default": ["inbox": true, "push": true], "groups": [:], "critical": ["security"],
                                    "version": 0, "updatedAt": nil]
        XCTAssertEqual(get(), expected)
        XCTAssertEqual(get(token: h.token("u")), expected, "the device route answers the same")
    }

    /// A save by one device reaches the user's every device live, those
    /// a notification's targeting would leave out too, and none of another user.
    func testASaveReachesEveryDeviceOfTheUserLiveAndNoOtherUser() throws {
        let phone = h.webSocket(), tablet = h.webSocket(), other = h.webSocket()
        h.hello(phone, user: "u", device: "phone")
        h.hello(tablet, user: "u", device: "tablet")
        h.hello(other, user: "v", device: "phone")
        h.settle()
        let android = h.request("PUT", "/v1/me/devices/tablet", token: h.token("u"), body: ["platform": "android"])
        h.settle()
        XCTAssertEqual(android.response?.status, 200)
        for s in [phone, tablet, other] { s.read(); s.frames = [] }

        let saved = put(["groups": ["ads": ["inbox": false]], "default": ["push": false]], token: h.token("u"), path: "/v1/me/preferences")
        XCTAssertEqual(saved.response?.status, 200)
        let p = try XCTUnwrap(saved.json?["preferences"]?.objectValue)
        XCTAssertEqual(p["default"], ["inbox": true, "push": false], "a channel the default leaves out is true")
        XCTAssertEqual(p["groups"], ["ads": ["inbox": false]])
        XCTAssertEqual(p["critical"], ["security"])
        XCTAssertEqual(p["version"], 1)
        XCTAssertNotNil(p["updatedAt"]?.stringValue)
        XCTAssertEqual(saved.json?.int("seq"), try store.feed(user).head)

        for s in [phone, tablet] {
            s.read()
            let change = try XCTUnwrap(s.frames.first?["change"]?.objectValue, "\(s.types)")
            XCTAssertEqual(change["op"], "preferences")
            XCTAssertEqual(change["preferences"], .object(p))
            XCTAssertFalse(s.types.contains("counts"), "a save moves no count")
        }
        other.read()
        XCTAssertEqual(other.frames, [], "another user's devices hear nothing")
        XCTAssertEqual(get(token: h.token("v"))?["version"], 0)
        XCTAssertEqual(transport.sent.count, 0, "a save sends no push")
    }

    /// On resume (a cursor before the save) and in resets: sync, event
    /// stream and the last frame of a WebSocket reset.
    func testResumesAndResetsCarryThem() throws {
        XCTAssertEqual(publish("n1", group: nil).response?.status, 201)
        let saved = put(["groups": ["ads": ["push": false]]])
        let p = try XCTUnwrap(saved.json?["preferences"])
        let tok = h.token("u")

        let resumed = h.request("GET", "/v1/me/sync", token: tok, query: [("cursor", "1")])
        h.settle()
        let changes = try XCTUnwrap(resumed.json?["changes"]?.arrayValue)
        XCTAssertEqual(changes.map { $0.objectValue?["op"] }, ["preferences"])
        XCTAssertEqual(changes[0].objectValue?["preferences"], p)

        let reset = h.request("GET", "/v1/me/sync", token: tok)
        h.settle()
        XCTAssertEqual(reset.json?["reset"], true)
        XCTAssertEqual(reset.json?["preferences"], p)

        let ws = h.webSocket()
        h.hello(ws, user: "u", device: "phone")
        h.settle(); ws.read()
        XCTAssertEqual(ws.types, ["reset", "welcome"])
        XCTAssertEqual(ws.frames[0]["preferences"], p)
        XCTAssertEqual(ws.frames[0]["final"], true)

        let resume = h.webSocket()
        h.hello(resume, user: "u", device: "tablet", cursor: 1)
        h.settle(); resume.read()
        XCTAssertEqual(resume.types, ["changes", "welcome"])
        XCTAssertEqual(resume.frames[0]["changes"]?.arrayValue?.first?.objectValue?["preferences"], p)
    }

    /// A group kept out of the inbox: the publish creates and changes
    /// nothing (not even one that replaces a stored notification); other
    /// groups and critical ones go in; an app-wide send does not count it.
    func testAGroupKeptOutOfTheInboxSuppressesItsPublishes() throws {
        XCTAssertEqual(publish("kept", group: "ads").response?.status, 201)
        XCTAssertEqual(put(["groups": ["ads": ["inbox": false], "security": ["inbox": false, "push": false]]]).response?.status, 200)
        let head = try store.feed(user).head

        for anid in ["new", "kept"] {
            let r = publish(anid, group: "ads")
            XCTAssertEqual(r.response?.status, 200)
            XCTAssertEqual(r.json, ["notification": nil, "seq": nil, "suppressed": "preferences"])
        }
        XCTAssertEqual(try store.feed(user).head, head, "nothing changed")
        XCTAssertEqual(try store.notification(user, appNotificationId: "kept")?.version, 1, "the stored one stays as it was")
        XCTAssertNil(try store.notification(user, appNotificationId: "new"))

        XCTAssertEqual(publish("chat", group: "chat").response?.status, 201)
        XCTAssertEqual(publish("none", group: nil).response?.status, 201)
        XCTAssertEqual(publish("alarm", group: "security").response?.status, 201, "a critical group ignores preferences")

        let bulk = h.request("POST", "/v1/apps/\(Self.app.id)/notifications",
                             body: ["userIds": ["u", "v"], "appNotificationId": "b", "payload": ["t": "x"], "groupName": "ads"])
        h.settle()
        XCTAssertEqual(bulk.response?.status, 202)
        XCTAssertEqual(bulk.json, ["users": 1], "u keeps ads out")
        XCTAssertNil(try store.notification(user, appNotificationId: "b"))

        // The default keeps everything without a group of its own out.
        XCTAssertEqual(put(["default": ["inbox": false], "groups": [:]]).response?.status, 200)
        XCTAssertEqual(publish("late", group: nil).json?["suppressed"], "preferences")
        XCTAssertEqual(publish("late", group: "security").response?.status, 201)
    }

    /// A group kept from push: its changes record no push, while the inbox
    /// still takes them; a critical group pushes whatever the user chose.
    func testAGroupKeptFromPushSendsNoneAndTheInboxStillWorks() throws {
        let reg = h.request("PUT", "/v1/me/devices/phone", token: h.token("u"),
                            body: ["platform": "ios", "push": ["service": "apns", "token": .string(PushOutboxTests.apnsToken)]])
        h.settle()
        XCTAssertEqual(reg.response?.status, 200)
        XCTAssertEqual(put(["groups": ["chat": ["push": false], "security": ["push": false]]]).response?.status, 200)

        let quiet = publish("c1", group: "chat")
        XCTAssertEqual(quiet.response?.status, 201, "the inbox still takes it")
        let id = try XCTUnwrap(quiet.json?["notification"]?.objectValue?["id"]?.stringValue)
        let patch = h.request("PATCH", server + "/notifications/\(id)", body: ["readState": "read"])
        h.settle()
        XCTAssertEqual(patch.response?.status, 200)
        h.gateway.soleEngine.runMaintenance(); h.settle()
        XCTAssertEqual(transport.sent.count, 0, "no alert, no tap for its changes")

        XCTAssertEqual(publish("s1", group: "security").response?.status, 201)
        XCTAssertEqual(publish("o1", group: "other").response?.status, 201)
        h.gateway.soleEngine.runMaintenance(); h.settle()
        XCTAssertEqual(transport.sent.map(\.job.message.kind), [.alert, .alert], "critical and other groups push")
        XCTAssertEqual(Set(transport.sent.compactMap(\.job.message.threadId)), ["security", "other"])
    }

    /// `If-Match: "<version>"`: 412 on a mismatch (nothing saved), 400 when malformed.
    func testIfMatch() throws {
        XCTAssertEqual(put(["groups": ["a": ["push": false]]], ifMatch: "\"0\"").response?.status, 200, "0: never saved")
        let stale = put(["groups": [:]], ifMatch: "\"0\"")
        XCTAssertEqual(stale.response?.status, 412)
        XCTAssertEqual(stale.json?["error"]?.objectValue?["code"], "precondition_failed")
        for bad in ["*", "\"x\"", "\"-1\"", ""] {
            XCTAssertEqual(put(["groups": [:]], ifMatch: bad).response?.status, 400, bad)
        }
        XCTAssertEqual(put(["groups": [:]], ifMatch: "1").response?.status, 200, "quotes optional")
        XCTAssertEqual(get()?["version"], 2)
        XCTAssertEqual(get()?["groups"], [:])
    }

    /// Bad input on every route is 400 and saves nothing.
    func testBadInputIsRefusedAndChangesNothing() throws {
        XCTAssertEqual(put(["groups": ["a": ["push": false]]]).response?.status, 200)
        let head = try store.feed(user).head
        let tooMany = JSON.object(JSONObject((0...Preferences.maxGroups).map { ("g\($0)", ["inbox": false]) }))
        let bad: [JSON] = [
            [:], "x", ["default": nil], ["groups": nil], ["default": ["inbox": nil]], ["groups": ["a": nil]],
            ["groups": ["a": ["push": nil]]], ["groups": ["": ["push": false]]],
            ["groups": [.init(stringLiteral: String(repeating: "g", count: 257)): ["push": false]]],
            ["groups": ["a": ["push": "no"]]], ["groups": ["a": ["sms": true]]], ["groups": ["a": true]],
            ["default": ["inbox": 0]], ["default": []], ["groups": []], ["critical": ["a"]], ["version": 3], ["other": 1],
            ["groups": tooMany],
        ]
        for body in bad {
            for path in [server + "/preferences", "/v1/me/preferences"] {
                let r = put(body, token: path.hasPrefix("/v1/me") ? h.token("u") : nil, path: path)
                XCTAssertEqual(r.response?.status, 400, "\(body.encodedString) on \(path)")
                XCTAssertEqual(r.json?["error"]?.objectValue?["code"], "bad_request")
            }
        }
        XCTAssertEqual(try store.feed(user).head, head, "nothing saved")
        XCTAssertEqual(get()?["groups"], ["a": ["push": false]])
        XCTAssertEqual(get()?["version"], 1)
    }

    func testOtherMethodsAre405() {
        for (path, token) in [(server + "/preferences", nil), ("/v1/me/preferences", h.token("u"))] {
            for method in ["POST", "PATCH", "DELETE"] {
                let r = h.request(method, path, token: token)
                h.settle()
                XCTAssertEqual(r.response?.status, 405, "\(method) \(path)")
                XCTAssertEqual(r.response?.header("Allow"), "GET, HEAD, PUT")
            }
        }
    }
}

private extension JSONObject {
    init(_ pairs: [(String, JSON)]) {
        self.init()
        for (k, v) in pairs { self[k] = v }
    }
}
