import HeraldPorts
import XCTest
import HeraldCore
@testable import HeraldGateway

/// Several server keys and token secrets per app, and `Gateway.reload`:
/// what a rotation does to requests and to each kind of open connection.
final class ReloadTests: XCTestCase {
    let me = "/v1/me"
    let id = Harness.app.id
    /// The harness app's secret ("ts", no kid) under a kid, and its successor.
    let old = TokenSecret(kid: "2026-05", secret: "ts")
    let new = TokenSecret(kid: "2026-11", secret: "ts-new")

    func app(keys: [String] = ["sk"], _ secrets: [TokenSecret]) -> AppConfig {
        AppConfig(id: id, serverKeys: keys, tokenSecrets: secrets)
    }

    /// Reloads and runs the shards' sweep; answers how many connections it ended.
    func reload(_ h: Harness, _ apps: [AppConfig]) -> Int {
        let ended = Locked<[Int]>([])
        h.gateway.reload(apps: apps) { n in ended.withLock { $0.append(n) } }
        h.settle()
        let calls = ended.withLock { $0 }
        XCTAssertEqual(calls.count, 1, "done runs once")
        return calls.first ?? -1
    }

    /// The status of a request once the gateway answered it.
    func status(_ h: Harness, _ r: RecordingResponder) -> Int? {
        h.settle()
        return r.response?.status
    }

    func open(_ h: Harness, _ user: String, token: String) -> RecordingSocket {
        let s = h.webSocket()
        h.hello(s, user: user, token: token)
        h.settle(); s.read()
        XCTAssertEqual(s.types.last, "welcome")
        return s
    }

    /// Every key is accepted; tokens are issued with the newest secret and
    /// its kid, and tokens of either secret verify.
    func testEveryKeyAndSecretOfAnAppWorks() throws {
        let h = Harness()
        _ = reload(h, [app(keys: ["sk-new", "sk"], [new, old])])
        for key in ["sk-new", "sk"] {
            XCTAssertEqual(status(h, h.request("GET", "/v1/apps/\(id)/users/u/notifications", token: key)), 200, key)
        }
        XCTAssertEqual(status(h, h.request("GET", "/v1/apps/\(id)/users/u/notifications", token: "sk-other")), 401)
        let issued = h.request("POST", "/v1/apps/\(id)/tokens", body: ["userId": "u"]).json?["token"]?.stringValue ?? ""
        let header = try JSONParser.parse(Base64URL.decode(issued.split(separator: ".")[0])!).objectValue
        XCTAssertEqual(header?["kid"], "2026-11")
        for t in [issued, h.token("u", signedWith: old), h.token("u")] {
            XCTAssertEqual(status(h, h.request("GET", me + "/counts", token: t)), 200)
        }
        let unknownKid = h.token("u", signedWith: TokenSecret(kid: "2025-01", secret: "ts"))
        XCTAssertEqual(status(h, h.request("GET", me + "/counts", token: unknownKid)), 401)
    }

    /// Retiring a secret closes the WebSockets of its tokens with 4001 (a
    /// refreshed one goes by its new token), answers held polls 401 and
    /// ends event streams; everything else stays as it was.
    func testRetiringASecretEndsOnlyTheConnectionsItSigned() {
        let h = Harness()
        let plainOld = open(h, "u", token: h.token("u"))
        XCTAssertEqual(reload(h, [app([new, old])]), 0, "adding a secret ends nothing")
        let kidOld = open(h, "u", token: h.token("u", signedWith: old))
        let kidNew = open(h, "u", token: h.token("u", signedWith: new))
        let refreshed = open(h, "u", token: h.token("u", signedWith: old))
        refreshed.session.receive(.text(Array(#"{"type":"refresh","ref":"r","token":"\#(h.token("u", signedWith: new))"}"#.utf8)))
        refreshed.read()
        XCTAssertEqual(refreshed.types.last, "ack")
        let poll = h.request("GET", me + "/sync", token: h.token("u"), query: [("cursor", "0"), ("wait", "30")])
        let stream = h.request("GET", me + "/events", token: h.token("u", signedWith: old))
        let keptStream = h.request("GET", me + "/events", token: h.token("u", signedWith: new))
        h.settle()
        XCTAssertNil(poll.response, "held")
        XCTAssertTrue(stream.streamStarted)

        XCTAssertEqual(reload(h, [app([new])]), 4)
        for s in [plainOld, kidOld] {
            s.read()
            XCTAssertEqual(s.session.closeRequest?.code, .unauthenticated)
            XCTAssertEqual(s.frames.last?["code"], "unauthorized")
        }
        for s in [kidNew, refreshed] { XCTAssertNil(s.session.closeRequest) }
        XCTAssertEqual(poll.response?.status, 401)
        XCTAssertTrue(stream.finished)
        XCTAssertFalse(keptStream.finished)
        XCTAssertTrue(h.gateway.metrics.prometheusText().contains(#"herald_dropped_connections_total{reason="auth_revoked"} 3"#))
        XCTAssertEqual(status(h, h.request("GET", me + "/counts", token: h.token("u", signedWith: old))), 401)

        // The connections left still get their changes.
        h.publish("u", "after")
        h.settle(); kidNew.read()
        XCTAssertEqual(changeSeqs(kidNew.frames), [1])
    }

    /// Removing an app ends every connection of it, and its key is refused.
    func testRemovingAnAppEndsItsConnections() {
        let h = Harness()
        let s = open(h, "u", token: h.token("u"))
        let other = AppConfig(id: "other.app", serverKey: "sk-other", tokenSecret: "ts-other")
        XCTAssertEqual(reload(h, [other]), 1)
        XCTAssertEqual(s.session.closeRequest?.code, .unauthenticated)
        XCTAssertEqual(status(h, h.request("GET", "/v1/apps/\(id)/users/u/notifications")), 401)
        XCTAssertEqual(status(h, h.request("GET", "/v1/apps/other.app/users/u/notifications", token: "sk-other")), 200)
    }

    /// A hello checked before the reload whose admission completes after
    /// the shard's sweep (it was not in the shard yet) is still ended.
    func testSubscriptionAdmittedAfterTheSweepIsEnded() {
        let h = Harness()
        let s = h.webSocket()
        h.hello(s, user: "u")
        let poll = h.request("GET", me + "/sync", token: h.token("u"), query: [("cursor", "0"), ("wait", "30")])
        let stream = h.request("GET", me + "/events", token: h.token("u"))
        h.gateway.reload(apps: [app([new])]) { n in XCTAssertEqual(n, 0) }
        h.loop.drain()  // the sweep, before the engine admitted anyone
        h.settle(); s.read()
        XCTAssertEqual(s.session.closeRequest?.code, .unauthenticated)
        XCTAssertEqual(poll.response?.status, 401)
        XCTAssertEqual(stream.response?.status, 401)
        XCTAssertFalse(stream.streamStarted)
        XCTAssertEqual(h.gateway.soleEngine.registry.followers(of: UserKey(app: id, user: "u")), 0)
    }
}
