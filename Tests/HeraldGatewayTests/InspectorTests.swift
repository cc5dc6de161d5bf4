import XCTest
import HeraldCore
import HeraldPorts
import HeraldStores
@testable import HeraldGateway

/// The inspector's routes (docs/PROTOCOL.md section 18): their keys, what
/// they show of a user's devices and pushes, and that nothing secret is in
/// any answer.
final class InspectorTests: XCTestCase {
    static let webhookSecret = [UInt8](repeating: 0x5a, count: 32)
    static let app = AppConfig(id: Harness.app.id, serverKeys: ["inspector-key"], tokenSecrets: [TokenSecret(secret: "inspector-secret")],
                               push: PushOutboxTests.push,
                               webhooks: [WebhookEndpoint(url: "http://127.0.0.1:9/hooks", secrets: [webhookSecret])])
    static let other = AppConfig(id: "other.app", serverKey: "other-key", tokenSecret: "other-secret")

    let transport = HeldPushes()
    var h: Harness!

    override func setUp() { h = Harness(apps: [Self.app, Self.other], push: transport) }

    func get(_ path: String, key: String = InspectorTests.app.serverKeys[0]) -> RecordingResponder {
        let r = h.request("GET", path, token: key)
        h.settle()
        return r
    }

    /// Asserts that `r`'s body holds none of the gateway's secrets, nor `also`.
    func assertNothingSecret(_ r: RecordingResponder, also: [String] = [], file: StaticString = #filePath, line: UInt = #line) {
        let body = String(decoding: r.response?.body ?? [], as: UTF8.self)
        for s in ["inspector-key", "inspector-secret", "other-key", Base64.encode(Self.webhookSecret), PushOutboxTests.apnsToken] + also {
            XCTAssertFalse(body.contains(s), "the answer holds \(s)", file: file, line: line)
        }
    }

    func testEveryRouteTakesOnlyItsOwnAppsKey() {
        for path in ["/v1/apps/\(Self.app.id)/inspect", "/v1/apps/\(Self.app.id)/users/u/inspect"] {
            XCTAssertEqual(get(path, key: "wrong").response?.status, 401, path)
            XCTAssertEqual(get(path, key: "other-key").response?.status, 401, "another app's key: \(path)")
            let missing = h.request("GET", path, headers: ["authorization": ""])
            h.settle()
            XCTAssertEqual(missing.response?.status, 401, "no key: \(path)")
            XCTAssertEqual(get(path).response?.status, 200, path)
        }
        XCTAssertEqual(get("/v1/apps/\(Self.app.id)/users/u%20v/inspect").response?.status, 400, "a bad user id")
        let badLimit = h.request("GET", "/v1/apps/\(Self.app.id)/users/u/inspect", token: "inspector-key", query: [("limit", "0")])
        h.settle()
        XCTAssertEqual(badLimit.response?.status, 400, "a bad page size")
        XCTAssertEqual(h.request("POST", "/v1/apps/\(Self.app.id)/inspect").response?.status, 405, "read-only")
    }

    func testAUsersInspectionShowsDevicesFeedAndPushOutcomesButNoHandle() throws {
        let token = h.token("u", app: Self.app)
        h.request("PUT", "/v1/me/devices/phone", token: token,
                  body: ["platform": "ios", "push": ["service": "apns", "token": .string(PushOutboxTests.apnsToken)]])
        h.request("POST", "/v1/apps/\(Self.app.id)/users/u/notifications", token: "inspector-key",
                  body: ["appNotificationId": "n1", "payload": ["title": "Hello", "body": "world"]])
        h.settle()
        h.gateway.soleEngine.runMaintenance()
        h.settle()
        XCTAssertEqual(transport.waiting.count, 1, "the phone's push")
        let before = get("/v1/apps/\(Self.app.id)/users/u/inspect")
        XCTAssertEqual(before.response?.status, 200)
        let device = try XCTUnwrap(before.json?["devices"]?.arrayValue?.first?.objectValue)
        XCTAssertEqual(device["push"], ["service": "apns"], "the service, never the token")
        XCTAssertEqual(device["pushOutcomes"], [])
        XCTAssertEqual(device["pushesPending"], 1, "claimed, in flight")
        XCTAssertEqual(device["connected"], false)
        assertNothingSecret(before)

        transport.answerAll(.unregistered("APNs 410 Unregistered for /3/device/\(PushOutboxTests.apnsToken)", reason: "Unregistered"))
        h.settle()
        let after = get("/v1/apps/\(Self.app.id)/users/u/inspect")
        let json = try XCTUnwrap(after.json)
        let phone = try XCTUnwrap(json["devices"]?.arrayValue?.first?.objectValue)
        XCTAssertEqual(phone["push"], .null)
        XCTAssertEqual(phone["pushesPending"], 0)
        let outcome = try XCTUnwrap(phone["pushOutcomes"]?.arrayValue?.first?.objectValue)
        XCTAssertEqual(outcome["outcome"], "handleRemoved")
        XCTAssertEqual(outcome["reason"], "Unregistered", "the service's reason code, not its text")
        XCTAssertEqual(json["notifications"]?.arrayValue?.count, 1)
        XCTAssertEqual(json["changes"]?.arrayValue?.compactMap { $0.objectValue?["seq"] }, [1])
        XCTAssertEqual(json["head"], 1)
        XCTAssertEqual(json["next"], .null)
        assertNothingSecret(after)
    }

    func testAnAppsInspectionShowsEndpointsByURLAndLiveStatus() throws {
        let ws = h.webSocket()
        h.hello(ws, user: "u", app: Self.app)
        h.settle()
        let r = get("/v1/apps/\(Self.app.id)/inspect")
        XCTAssertEqual(r.response?.status, 200)
        let json = try XCTUnwrap(r.json)
        XCTAssertEqual(json["webhooks"], [["url": "http://127.0.0.1:9/hooks", "inFlight": 0, "pending": 0, "lastFailures": []]])
        XCTAssertEqual(json["connections"]?.objectValue?["websocket"], 1)
        XCTAssertEqual(json["health"]?.objectValue?["store"], "ok")
        assertNothingSecret(r)
        XCTAssertEqual(get("/v1/apps/other.app/inspect", key: "other-key").json?["webhooks"], [], "another app's endpoints are not shown")
    }

    func testAnAppsInspectionAnswersWhileTheStoreIsDownWithoutItsCounts() throws {
        let store = FailingStore()
        h = Harness(store: store, apps: [Self.app], push: transport)
        store.failCommits = 1
        let failed = h.request("POST", "/v1/apps/\(Self.app.id)/users/u/notifications", token: "inspector-key",
                               body: ["appNotificationId": "n1", "payload": ["title": "Hello"]])
        h.settle()
        XCTAssertEqual(failed.response?.status, 503)
        let r = get("/v1/apps/\(Self.app.id)/inspect")
        XCTAssertEqual(r.response?.status, 200)
        XCTAssertEqual(r.json?["health"]?.objectValue?["store"], "unavailable")
        XCTAssertEqual(r.json?["webhooks"]?.arrayValue?.first?.objectValue?["pending"], .null, "the store is not asked")
    }
}

/// The inspector's memory of outcomes stays bounded however many keys and outcomes come.
final class RecentOutcomesTests: XCTestCase {
    func outcome(_ at: Millis) -> RecentOutcome { RecentOutcome(at: at, outcome: "delivered", reason: nil) }

    func testEachKeyKeepsItsLastOutcomesNewestFirst() {
        var r = RecentOutcomes<String>(perKey: 3, keys: 10)
        for t in 1...5 { r.note("a", outcome(Millis(t))) }
        XCTAssertEqual(r.recent("a").map(\.at), [5, 4, 3])
        XCTAssertEqual(r.recent("b").count, 0)
    }

    func testPastItsKeysTheLeastRecentlyNotedHalfGoes() {
        var r = RecentOutcomes<Int>(perKey: 1, keys: 4)
        for k in 0..<4 { r.note(k, outcome(Millis(k))) }
        r.note(0, outcome(10))  // 0 noted again: now the most recent
        r.note(4, outcome(11))
        XCTAssertEqual((0...4).filter { !r.recent($0).isEmpty }, [0, 3, 4], "1 and 2 were noted least recently")
    }
}
