import HeraldPorts
import XCTest
import Synchronization
import HeraldCore
import HeraldStores
@testable import HeraldGateway

/// Stands where the push services are: keeps each push the gateway sends
/// until the test answers it, as a service would.
final class HeldPushes: PushTransport, @unchecked Sendable {  // test thread only, but the protocol asks Sendable
    let capacity: Int
    private(set) var waiting: [(push: OutgoingPush, answer: @Sendable (PushOutcome) -> Void)] = []
    private(set) var sent: [OutgoingPush] = []
    private(set) var reloads = 0

    init(capacity: Int = 1_000) { self.capacity = capacity }

    func send(_ push: OutgoingPush, completion: @escaping @Sendable (PushOutcome) -> Void) {
        sent.append(push)
        waiting.append((push, completion))
    }
    func share(_ tokens: SharedTokens) {}
    func reload(_ apps: [AppConfig]) { reloads += 1 }
    func stop() {}

    /// Answers every push waiting with `outcome`.
    func answerAll(_ outcome: PushOutcome) {
        let w = waiting
        waiting.removeAll()
        for (_, answer) in w { answer(outcome) }
    }

    /// Answers the first push waiting that `which` picks with `outcome`.
    func answerFirst(where which: (OutgoingPush) -> Bool, _ outcome: PushOutcome) {
        waiting.remove(at: waiting.firstIndex { which($0.push) }!).answer(outcome)
    }

    /// Answers the push waiting longest with `outcome`.
    func answerFirst(_ outcome: PushOutcome) {
        waiting.removeFirst().answer(outcome)
    }
}

/// The push outbox in-process (SPEC section 10): what is recorded for which
/// device, when it is sent, and what each service answer does.
final class PushOutboxTests: XCTestCase {
    static let apnsToken = String(repeating: "0a", count: 32)
    static let push = PushSettings(
        alert: AlertPointers(title: "/title", body: "/body"),
        apns: PushSettings.APNs(teamId: "TEAM", keyId: "KEY", keyFile: "/dev/null", topic: "com.example.app"),
        fcm: PushSettings.FCM(serviceAccountFile: "/dev/null"),
        webPush: {
            var w = PushSettings.WebPush(vapidPrivateKeyFile: "/dev/null", subject: "mailto:ops@example.com", publicKey: "BPUB")
            w.allowedHosts = ["push.example.com"]
            return w
        }())
    static let app = AppConfig(id: "app.test", serverKey: "sk", tokenSecret: "ts", push: push)
    /// A browser's subscription key: a real P-256 point (the generator).
    static let p256dh = "BGsX0fLhLEJH-Lzm5WOkQPJ3A32BLeszoPShOUXYmMKWT-NC4v4af5uO5-tKfA-eFivOM1drMV7Oy7ZAaDe_UfU"

    var transport = HeldPushes()
    var h: Harness!

    override func setUp() {
        h = Harness(apps: [Self.app], push: transport)
    }

    /// A gateway whose transport takes `capacity` pushes at once: the rest
    /// wait in the outbox, to be claimed by the dispatcher's turn.
    func narrow(_ capacity: Int) {
        transport = HeldPushes(capacity: capacity)
        h = Harness(apps: [Self.app], push: transport)
    }

    func register(_ user: String, _ device: String, _ push: JSON, platform: String = "ios") -> RecordingResponder {
        let r = h.request("PUT", "/v1/me/devices/\(device)", token: h.token(user), body: ["platform": .string(platform), "push": push])
        h.settle()
        return r
    }

    func apns(_ token: String = apnsToken) -> JSON { ["service": "apns", "token": .string(token)] }

    /// Settles, then lets the dispatcher claim what is due and hand it over.
    func dispatch() {
        h.settle()
        h.gateway.soleEngine.runMaintenance()
        h.settle()
    }

    func publish(_ user: String, _ anid: String, title: String? = "Hello", priority: String = "normal") -> RecordingResponder {
        var payload: JSONObject = ["body": "world"]
        if let title { payload["title"] = .string(title) }
        return h.request("POST", "/v1/apps/\(Self.app.id)/users/\(user)/notifications",
                         body: ["appNotificationId": .string(anid), "payload": .object(payload), "priority": .string(priority),
                                "groupName": "chat"])
    }

    var pending: Int { (try? h.gateway.soleEngine.reads.pendingPushes()) ?? -1 }

    /// A snooze that ends (SPEC section 11) pushes as a new notification
    /// does: an alert to a device that is not connected.
    func testAWokenNotificationAlertsADisconnectedDevice() throws {
        XCTAssertEqual(register("u", "phone", apns()).response?.status, 200)
        let published = publish("u", "n1")
        dispatch()
        transport.answerAll(.delivered)
        dispatch()
        let id = try XCTUnwrap(published.json?["notification"]?.objectValue?["id"]?.stringValue)
        let until = h.clock.now() + 30_000
        let snooze = h.request("PATCH", "/v1/me/notifications/\(id)", token: h.token("u"), device: "phone",
                               body: ["userActionState": "snoozed", "snoozedUntil": .string(RFC3339.format(until))])
        dispatch()
        XCTAssertEqual(snooze.response?.status, 200)
        transport.answerAll(.delivered)
        h.clock.advance(seconds: 30)
        let before = transport.sent.count
        dispatch()
        dispatch()
        let woke = transport.sent[before...].map(\.job.message)
        XCTAssertEqual(woke.map(\.kind), [.alert], "woken: alerted as new")
        XCTAssertEqual(woke.first?.title, "Hello")
        XCTAssertEqual(woke.first?.notificationId, id)
    }

    func testADisconnectedDeviceGetsAnAlertAndAConnectedOneNothing() {
        XCTAssertEqual(register("u", "phone", apns()).response?.status, 200)
        XCTAssertEqual(register("u", "tablet", apns(String(repeating: "0b", count: 32))).response?.status, 200)
        let ws = h.webSocket()
        h.hello(ws, user: "u", device: "tablet")
        let published = publish("u", "n1", priority: "high")
        dispatch()
        XCTAssertEqual(published.response?.status, 201)
        XCTAssertEqual(transport.sent.map(\.job.deviceId), ["phone"], "the connected tablet gets no push")
        let m = transport.sent[0].job.message
        let id = published.json?["notification"]?.objectValue?["id"]?.stringValue
        XCTAssertEqual(m.kind, .alert)
        XCTAssertEqual(m.title, "Hello")
        XCTAssertEqual(m.body, "world")
        XCTAssertEqual(m.threadId, "chat")
        XCTAssertTrue(m.high)
        XCTAssertEqual(m.notificationId, id)
        XCTAssertEqual(m.op, .upsert)
        XCTAssertEqual(m.cursor, 1)
        XCTAssertEqual(transport.sent[0].handle, .apns(token: Self.apnsToken, environment: .production))
        XCTAssertEqual(pending, 1, "in flight until answered")
        transport.answerAll(.delivered)
        h.settle()
        XCTAssertEqual(pending, 0)
        XCTAssertEqual(h.gateway.metrics.push.sent(.apns, .delivered), 1)
    }

    /// `herald_push_pending` on a durable store, which keeps the outbox's
    /// length in the batches that add and remove its rows: the gauge reads
    /// what is waiting or in flight, again at the dispatcher's first poll
    /// `pendingEvery` after the last read.
    func testThePendingGaugeFollowsTheOutboxOfADurableStore() throws {
        h = Harness(store: try SQLiteStore(path: ":memory:"), apps: [Self.app], push: transport)
        var gauge: Int { h.gateway.metrics.push.pending.load(ordering: .relaxed) }
        XCTAssertEqual(register("u", "phone", apns()).response?.status, 200)
        XCTAssertEqual(register("u", "tablet", apns(String(repeating: "0b", count: 32))).response?.status, 200)
        let published = (1...3).map { publish("u", "n\($0)") }
        dispatch()
        XCTAssertEqual(published.map { $0.response?.status }, [201, 201, 201])
        XCTAssertEqual(transport.waiting.count, 6)
        XCTAssertEqual(gauge, 6, "in flight until answered")
        transport.answerFirst(.delivered)
        transport.answerFirst(.retry("503", retryAfterSeconds: nil))
        h.settle()
        h.clock.advance(millis: Outbox.pendingEvery - 1)
        dispatch()
        XCTAssertEqual(gauge, 6, "read again only every pendingEvery")
        h.clock.advance(millis: Outbox.pollEvery)
        dispatch()
        XCTAssertEqual(gauge, 5, "one delivered, one kept to retry")
        XCTAssertEqual(transport.waiting.count, 5, "the retry is due again")
        transport.answerAll(.delivered)
        h.clock.advance(millis: Outbox.pendingEvery + Outbox.pollEvery)
        dispatch()
        XCTAssertEqual(gauge, 0)
    }

    func testAPayloadWithoutTheAlertFieldsGivesATap() {
        _ = register("u", "phone", apns())
        _ = publish("u", "n1", title: nil)
        dispatch()
        XCTAssertEqual(transport.sent.map(\.job.message.kind), [.tap])
        XCTAssertEqual(transport.sent.first?.job.message.op, .upsert)
    }

    func testADismissOnThePhoneTapsTheSleepingTablet() {
        _ = register("u", "tablet", apns())
        let ws = h.webSocket()
        h.hello(ws, user: "u", device: "phone")
        let published = publish("u", "n1")
        dispatch()
        transport.answerAll(.delivered)
        h.settle()
        let id = published.json!["notification"]!.objectValue!["id"]!.stringValue!
        ws.session.receive(.text(JSON.object(["type": "update", "ref": "c1", "id": .string(id), "userActionState": "dismissed"]).encoded))
        dispatch()
        XCTAssertEqual(transport.sent.map(\.job.message.kind), [.alert, .tap])
        let tap = transport.sent[1].job.message
        XCTAssertEqual(tap.op, .state)
        XCTAssertEqual(tap.notificationId, id)
        XCTAssertEqual(tap.cursor, 2)
    }

    func testTapsRecordedWhileOneIsInFlightAreSentAgainAsOne() {
        _ = register("u", "tablet", apns())
        for i in 0..<3 { _ = publish("u", "n\(i)", title: nil) }
        dispatch()
        XCTAssertEqual(transport.sent.map(\.job.message.cursor), [1], "the first tap goes as it is recorded")
        _ = publish("u", "late", title: nil)
        dispatch()
        XCTAssertEqual(transport.sent.count, 1, "at most one tap in flight")
        transport.answerAll(.delivered)
        h.settle()
        h.clock.advance(seconds: 15)
        dispatch()
        XCTAssertEqual(transport.sent.map(\.job.message.cursor), [1, 4], "the taps recorded in flight go after it, as one")
        transport.answerAll(.delivered)
        dispatch()
        XCTAssertEqual(pending, 0)
    }

    /// iOS budgets background pushes: taps to one device go at least
    /// `tapIntervalSeconds` apart, counted from the last one delivered.
    func testTapsToOneDeviceAreSpacedByTheAppsInterval() {
        var push = Self.push
        push.tapIntervalSeconds = 30
        h = Harness(apps: [AppConfig(id: Self.app.id, serverKey: "sk", tokenSecret: "ts", push: push)], push: transport)
        _ = register("u", "tablet", apns())
        _ = register("u", "phone", apns(String(repeating: "0b", count: 32)))
        _ = publish("u", "n1", title: nil)
        dispatch()
        XCTAssertEqual(transport.sent.map(\.job.deviceId).sorted(), ["phone", "tablet"])
        transport.answerAll(.delivered)
        h.settle()
        h.clock.advance(seconds: 10)
        _ = publish("u", "n2", title: nil)
        _ = publish("u", "n3", title: nil)
        _ = publish("u", "n4")
        dispatch()
        XCTAssertEqual(transport.sent.map(\.job.message.kind), [.tap, .tap, .alert, .alert], "alerts are not spaced")
        transport.answerAll(.delivered)
        h.settle()
        h.clock.advance(millis: 19_999)
        dispatch()
        XCTAssertEqual(transport.sent.count, 4, "the taps wait out the 30 s")
        XCTAssertEqual(pending, 2, "one waiting per device")
        h.clock.advance(millis: 1)
        dispatch()
        XCTAssertEqual(transport.sent.count, 6)
        XCTAssertEqual(transport.sent.suffix(2).map(\.job.message.cursor), [3, 3], "each device's tap carries the last change")
        transport.answerAll(.delivered)
        h.settle()
        XCTAssertEqual(pending, 0)
    }

    /// A reload's interval holds for the taps sent after it; the spacing a
    /// tap sent before it wrote stands.
    func testAReloadedTapIntervalSpacesTheTapsSentAfterIt() {
        _ = register("u", "tablet", apns())
        _ = publish("u", "n1", title: nil)
        dispatch()
        transport.answerAll(.delivered)
        h.settle()
        var push = Self.push
        push.tapIntervalSeconds = 0
        h.gateway.reload(apps: [AppConfig(id: Self.app.id, serverKey: "sk", tokenSecret: "ts", push: push)]) { _ in }
        _ = publish("u", "n2", title: nil)
        dispatch()
        XCTAssertEqual(transport.sent.count, 1, "the 15 s written before the reload stand")
        h.clock.advance(seconds: 15)
        dispatch()
        XCTAssertEqual(transport.sent.count, 2)
        transport.answerAll(.delivered)
        h.settle()
        _ = publish("u", "n3", title: nil)
        dispatch()
        XCTAssertEqual(transport.sent.map(\.job.message.cursor), [1, 2, 3], "no spacing after a tap sent under 0")
    }

    func testTapsWaitingForRoomCoalesceAndAreClaimedWhenThereIsSome() {
        narrow(1)
        _ = register("u", "tablet", apns())
        _ = register("v", "phone", apns(String(repeating: "0b", count: 32)))
        _ = publish("v", "n1")
        for i in 0..<3 { _ = publish("u", "n\(i)", title: nil) }
        dispatch()
        XCTAssertEqual(transport.sent.map(\.job.user.user), ["v"], "one push at once")
        XCTAssertEqual(pending, 2, "three taps waiting became one")
        transport.answerAll(.delivered)
        dispatch()
        XCTAssertEqual(transport.sent.map(\.job.user.user), ["v", "u"])
        XCTAssertEqual(transport.sent.last?.job.message.cursor, 3, "with the last cursor")
    }

    func testADeadHandleIsRemovedAndGetsNothingMore() {
        _ = register("u", "phone", apns())
        _ = publish("u", "n1")
        _ = publish("u", "n2")
        dispatch()
        XCTAssertEqual(transport.sent.count, 2)
        transport.answerAll(.unregistered("410 Unregistered", reason: "Unregistered"))
        h.settle()
        XCTAssertEqual(pending, 0)
        let listing = h.request("GET", "/v1/apps/\(Self.app.id)/users/u/devices")
        h.settle()
        let device = listing.json?["devices"]?.arrayValue?.first?.objectValue
        XCTAssertEqual(device?["deviceId"], "phone", "the device stays registered")
        XCTAssertEqual(device?["push"], .null)
        _ = publish("u", "n3")
        dispatch()
        XCTAssertEqual(transport.sent.count, 2)
        XCTAssertEqual(h.gateway.metrics.push.sent(.apns, .unregistered), 2)
    }

    func testARetryWaitsForRetryAfterAndTheBackoff() {
        _ = register("u", "phone", apns())
        _ = publish("u", "n1")
        dispatch()
        transport.answerAll(.retry("503 ServiceUnavailable", retryAfterSeconds: 30))
        dispatch()
        h.clock.advance(seconds: 29)
        dispatch()
        XCTAssertEqual(transport.sent.count, 1, "not before Retry-After")
        h.clock.advance(seconds: 2)
        dispatch()
        XCTAssertEqual(transport.sent.count, 2)
        XCTAssertEqual(transport.sent[1].job.attempts, 1)
        // The next wait is the backoff's: 2 s (up to a quarter more).
        transport.answerAll(.retry("429", retryAfterSeconds: nil))
        dispatch()
        h.clock.advance(millis: 1_999)
        dispatch()
        XCTAssertEqual(transport.sent.count, 2)
        h.clock.advance(millis: 502)
        dispatch()
        XCTAssertEqual(transport.sent.count, 3)
        transport.answerAll(.delivered)
        h.settle()
        XCTAssertEqual(h.gateway.metrics.push.sent(.apns, .retried), 2)
        XCTAssertEqual(pending, 0)
    }

    func testRefusedCredentialsAreKeptRetriedAndShownInHealth() {
        _ = register("u", "phone", apns())
        _ = publish("u", "n1")
        dispatch()
        XCTAssertEqual(h.request("GET", "/healthz").json?["push"], "ok")
        transport.answerAll(.credentialsRefused("403 InvalidProviderToken"))
        h.settle()
        XCTAssertEqual(h.request("GET", "/healthz").json?["push"], "failing")
        XCTAssertEqual(pending, 1, "kept")
        h.clock.advance(seconds: 2)
        dispatch()
        transport.answerAll(.delivered)
        h.settle()
        XCTAssertEqual(h.request("GET", "/healthz").json?["push"], "ok")
    }

    /// An alert to u's phone that lives 5 s, handed to the transport.
    private func sendAlertLiving5s() {
        _ = register("u", "phone", apns())
        _ = h.request("POST", "/v1/apps/\(Self.app.id)/users/u/notifications",
                      body: ["appNotificationId": "short", "payload": ["title": "t", "body": "b"], "ttlSeconds": 5])
        dispatch()
    }

    func testAPushPastItsLifetimeIsDropped() {
        sendAlertLiving5s()
        transport.answerAll(.retry("503", retryAfterSeconds: 10))
        h.settle()
        XCTAssertEqual(pending, 0)
        XCTAssertEqual(h.gateway.metrics.push.sent(.apns, .expired), 1)
    }

    func testAPushWithLessThanASecondLeftIsNotSent() {
        sendAlertLiving5s()
        // Its answer comes 0.5 s on; Retry-After 4 would leave it 0.5 s.
        h.clock.advance(millis: 500)
        transport.answerAll(.retry("503", retryAfterSeconds: 4))
        h.settle()
        XCTAssertEqual(pending, 0)
        XCTAssertEqual(h.gateway.metrics.push.sent(.apns, .expired), 1)
        XCTAssertEqual(h.gateway.metrics.push.sent(.apns, .retried), 0)
    }

    func testAPushClaimedWithLessThanASecondLeftIsNotSent() {
        sendAlertLiving5s()
        // Due at 4 s, with exactly 1 s left: kept.
        transport.answerAll(.retry("503", retryAfterSeconds: 4))
        h.settle()
        XCTAssertEqual(h.gateway.metrics.push.sent(.apns, .retried), 1)
        // Claimed only at 4.5 s (a busy engine): 0.5 s left, not sent.
        h.clock.advance(millis: 4_500)
        dispatch()
        XCTAssertEqual(transport.sent.count, 1)
        XCTAssertEqual(pending, 0)
        XCTAssertEqual(h.gateway.metrics.push.sent(.apns, .expired), 1)
    }

    var pushProblems: [JSON] {
        let r = h.request("GET", "/healthz")
        return r.json?["pushProblems"]?.arrayValue ?? []
    }

    func testBadEnvironmentKeyInTokenMarksOnlyThatEnvironmentFailing() {
        _ = register("dev", "phone", ["service": "apns", "token": .string(String(repeating: "0c", count: 32)), "environment": "development"])
        _ = register("prod", "phone", apns())
        _ = publish("dev", "n1")
        _ = publish("prod", "n1")
        dispatch()
        transport.answerFirst(where: { $0.job.user.user == "dev" }, .credentialsRefused("APNs 403 BadEnvironmentKeyInToken"))
        h.settle()
        XCTAssertEqual(h.request("GET", "/healthz").json?["push"], "failing")
        let problem: JSON = ["app": .string(Self.app.id), "service": "apns", "environment": "development", "problem": "credentialsRefused"]
        XCTAssertEqual(pushProblems, [problem])
        // Production devices' pushes go through and change nothing of it.
        transport.answerAll(.delivered)
        h.settle()
        XCTAssertEqual(pushProblems, [problem])
        h.clock.advance(seconds: 2)
        dispatch()
        transport.answerAll(.delivered)
        h.settle()
        XCTAssertEqual(h.request("GET", "/healthz").json?["push"], "ok")
        XCTAssertEqual(pushProblems, [])
    }

    func testMostAnswersCallingHandlesDeadForOneReasonShowInHealth() {
        func send(_ users: Range<Int>) {
            for i in users {
                _ = register("u\(i)", "phone", apns(String(format: "%064x", i + 1)))
                _ = publish("u\(i)", "n1")
            }
            dispatch()
        }
        send(0..<9)
        transport.answerAll(.unregistered("APNs 400 DeviceTokenNotForTopic", reason: "DeviceTokenNotForTopic"))
        h.settle()
        XCTAssertEqual(pushProblems, [], "too few answers to judge")
        send(9..<10)
        transport.answerAll(.unregistered("APNs 400 DeviceTokenNotForTopic", reason: "DeviceTokenNotForTopic"))
        h.settle()
        XCTAssertEqual(pushProblems, [["app": .string(Self.app.id), "service": "apns", "problem": "handlesDead",
                                       "reason": "DeviceTokenNotForTopic"]])
        XCTAssertEqual(h.request("GET", "/healthz").json?["push"], "ok", "the credentials are not refused")
        XCTAssertEqual(h.gateway.metrics.push.sent(.apns, .unregistered, reason: "DeviceTokenNotForTopic"), 10)
        // Once most of the last 20 go through, it is over.
        send(10..<21)
        transport.answerAll(.delivered)
        h.settle()
        XCTAssertEqual(pushProblems, [])
    }

    func testAMovedHandleStopsTheFirstUsersPushes() {
        _ = register("alice", "phone", apns())
        XCTAssertEqual(register("bob", "phone2", apns()).response?.status, 200)
        _ = publish("alice", "n1")
        _ = publish("bob", "n1")
        dispatch()
        XCTAssertEqual(transport.sent.map(\.job.user.user), ["bob"])
        let listing = h.request("GET", "/v1/apps/\(Self.app.id)/users/alice/devices")
        h.settle()
        XCTAssertEqual(listing.json?["devices"]?.arrayValue?.first?.objectValue?["push"], .null)
    }

    func testAPushWaitingForAHandleRemovedSinceIsNotSent() {
        narrow(1)
        _ = register("v", "phone", apns(String(repeating: "0b", count: 32)))
        _ = register("u", "phone", apns())
        _ = publish("v", "n1")
        _ = publish("u", "n1")
        h.settle()
        XCTAssertEqual(pending, 2)
        _ = register("u", "phone", .null)
        transport.answerAll(.delivered)
        dispatch()
        XCTAssertEqual(transport.sent.map(\.job.user.user), ["v"])
        XCTAssertEqual(pending, 0)
    }

    func testWebPushGetsAlertsCarryingTheChangeAndNoTaps() {
        let sub: JSON = ["service": "webpush", "subscription": ["endpoint": "https://push.example.com/s/1",
                                                                "keys": ["p256dh": .string(Self.p256dh), "auth": "AAAAAAAAAAAAAAAAAAAAAA"]]]
        XCTAssertEqual(register("u", "browser", sub, platform: "web").response?.status, 200)
        let ws = h.webSocket()
        h.hello(ws, user: "u", device: "phone")
        let published = publish("u", "n1")
        _ = publish("u", "quiet", title: nil)
        dispatch()
        XCTAssertEqual(transport.sent.map(\.job.message.kind), [.alert])
        XCTAssertEqual(transport.sent.first?.job.message.change?.objectValue?["seq"], 1)
        let id = published.json!["notification"]!.objectValue!["id"]!.stringValue!
        ws.session.receive(.text(JSON.object(["type": "update", "ref": "c1", "id": .string(id), "readState": "read"]).encoded))
        dispatch()
        XCTAssertEqual(transport.sent.count, 1, "a state change sends a browser nothing")
    }

    func testHandlesAreValidatedAgainstTheAppsServicesAndHosts() {
        func status(_ push: JSON) -> Int? { register("u", "d", push).response?.status }
        let keys: JSON = ["p256dh": .string(Self.p256dh), "auth": "AAAAAAAAAAAAAAAAAAAAAA"]
        XCTAssertEqual(status(["service": "apns", "token": "zz"]), 400)
        XCTAssertEqual(status(["service": "apns", "token": .string(String(repeating: "a", count: 63))]), 400)
        XCTAssertEqual(status(["service": "apns", "token": .string(Self.apnsToken), "environment": "staging"]), 400)
        XCTAssertEqual(status(["service": "wns", "token": "x"]), 400)
        XCTAssertEqual(status(["service": "fcm", "token": ""]), 400)
        XCTAssertEqual(status(["service": "webpush", "subscription": ["endpoint": "http://push.example.com/s", "keys": keys]]), 400)
        XCTAssertEqual(status(["service": "webpush", "subscription": ["endpoint": "https://169.254.169.254/latest", "keys": keys]]), 400)
        XCTAssertEqual(status(["service": "webpush", "subscription": ["endpoint": "https://evil.example.com/s", "keys": keys]]), 400)
        XCTAssertEqual(status(["service": "webpush", "subscription": ["endpoint": "https://user@push.example.com/s", "keys": keys]]), 400)
        XCTAssertEqual(status(["service": "webpush", "subscription": ["endpoint": "https://push.example.com/s",
                                                                     "keys": ["p256dh": .string("B" + String(repeating: "A", count: 86)),
                                                                              "auth": "AAAAAAAAAAAAAAAAAAAAAA"]]]), 400, "not a P-256 point")
        XCTAssertEqual(status(["service": "webpush", "subscription": ["endpoint": "https://push.example.com:8443/s", "keys": keys]]), 400,
                       "a port the allowed hosts do not name")
        XCTAssertEqual(status(["service": "webpush", "subscription": ["endpoint": "https://a[.push.example.com/s", "keys": keys]]), 400)
        XCTAssertEqual(status(["service": "webpush", "subscription": ["endpoint": "https://push.example.com:+443/s", "keys": keys]]), 400)
        XCTAssertEqual(status(["service": "webpush", "subscription": ["endpoint": "HTTPS://Push.Example.com:443/s", "keys": keys]]), 200)
        // Keys with or without `=` padding (browsers and libraries differ), but only the padding that completes them.
        func keyed(_ p256dh: String, _ auth: String) -> JSON {
            ["service": "webpush", "subscription": ["endpoint": "https://push.example.com/s",
                                                    "keys": ["p256dh": .string(p256dh), "auth": .string(auth)]]]
        }
        XCTAssertEqual(status(keyed(Self.p256dh + "=", "AAAAAAAAAAAAAAAAAAAAAA==")), 200)
        XCTAssertEqual(status(keyed(Self.p256dh, "AAAAAAAAAAAAAAAAAAAAAA==")), 200)
        for (p256dh, auth) in [(Self.p256dh + "==", "AAAAAAAAAAAAAAAAAAAAAA"), (Self.p256dh, "AAAAAAAAAAAAAAAAAAAAAA="),
                               (Self.p256dh, "AAAAAAAAAAAAAAAAAAAAAA==="), (Self.p256dh, "AAAAAAAAAAAAAAAAAAAA=AA=")] {
            XCTAssertEqual(status(keyed(p256dh, auth)), 400, "\(p256dh) \(auth)")
        }
        let devices = h.request("GET", "/v1/apps/\(Self.app.id)/users/u/devices")
        h.settle()
        XCTAssertEqual(devices.json?["devices"]?.arrayValue?.first?.objectValue?["push"], ["service": "webpush"],
                       "listings show the service, never the subscription")
        // An app without push refuses every handle.
        let bare = Harness(apps: [Harness.app], push: transport)
        let r = bare.request("PUT", "/v1/me/devices/d", token: bare.token("u"), body: ["push": apns()])
        bare.settle()
        XCTAssertEqual(r.response?.status, 400)
    }

    func testTheServerRegistersAndDeletesDevicesAndDevicesAskWhichServices() {
        let put = h.request("PUT", "/v1/apps/\(Self.app.id)/users/u/devices/phone", body: ["platform": "android",
                                                                                         "push": ["service": "fcm", "token": "abc:def"]])
        h.settle()
        XCTAssertEqual(put.response?.status, 200)
        XCTAssertEqual(put.json?["device"]?.objectValue?["push"], ["service": "fcm"])
        let services = h.request("GET", "/v1/me/push", token: h.token("u"))
        XCTAssertEqual(services.json?["services"], ["apns", "fcm", "webpush"])
        XCTAssertEqual(services.json?["webPushPublicKey"], "BPUB")
        XCTAssertEqual(h.request("PUT", "/v1/apps/\(Self.app.id)/users/u/devices/phone", token: "wrong", body: [:]).response?.status, 401)
        let del = h.request("DELETE", "/v1/apps/\(Self.app.id)/users/u/devices/phone")
        h.settle()
        XCTAssertEqual(del.response?.status, 204)
        let again = h.request("DELETE", "/v1/apps/\(Self.app.id)/users/u/devices/phone")
        h.settle()
        XCTAssertEqual(again.response?.status, 404)
    }

    /// Each way of registering a handle names it in the batch's claim, so
    /// a shared store locks its holder in the one order (PostgresStore).
    func testEveryRegistrationOfAHandleClaimsItsHolder() {
        let store = FailingStore()
        h = Harness(store: store, apps: [Self.app], push: transport)
        let u = UserKey(app: Self.app.id, user: "u")
        func claimed(_ handle: PushHandle) -> Bool { store.claimedLookups.contains(.pushHolder(u, key: handle.key)) }
        XCTAssertEqual(register("u", "phone", apns()).response?.status, 200)
        XCTAssertTrue(claimed(.apns(token: Self.apnsToken, environment: .production)), "PUT /v1/me/devices/{id}")
        let put = h.request("PUT", "/v1/apps/\(Self.app.id)/users/u/devices/tab", body: ["platform": "android",
                                                                                       "push": ["service": "fcm", "token": "abc:def"]])
        h.settle()
        XCTAssertEqual(put.response?.status, 200)
        XCTAssertTrue(claimed(.fcm(token: "abc:def")), "the server's PUT")
        let ws = h.webSocket()
        let o: JSONObject = ["type": "hello", "token": .string(h.token("u")), "deviceId": "d1",
                             "push": ["service": "fcm", "token": "ws:token"]]
        ws.session.receive(.text(JSON.object(o).encoded))
        h.settle()
        ws.read()
        XCTAssertEqual(ws.frames.last?["type"], "welcome")
        XCTAssertTrue(claimed(.fcm(token: "ws:token")), "a hello with push")
    }

    func testAHelloWithAHandleTheAppCannotTakeIsRefused() {
        let ws = h.webSocket()
        var o: JSONObject = ["type": "hello", "token": .string(h.token("u")), "deviceId": "d1"]
        o["push"] = ["service": "webpush", "subscription": ["endpoint": "https://evil.example.com/s",
                                                            "keys": ["p256dh": .string(Self.p256dh), "auth": "AAAAAAAAAAAAAAAAAAAAAA"]]]
        ws.session.receive(.text(JSON.object(o).encoded))
        h.settle()
        ws.read()
        XCTAssertEqual(ws.frames.first?["code"], "bad_request")
        XCTAssertFalse(ws.types.contains("welcome"))
        let ok = h.webSocket()
        o["push"] = apns()
        o["deviceId"] = "d2"
        ok.session.receive(.text(JSON.object(o).encoded))
        h.settle()
        ok.read()
        XCTAssertEqual(ok.frames.last?["type"], "welcome")
        let listing = h.request("GET", "/v1/apps/\(Self.app.id)/users/u/devices")
        h.settle()
        XCTAssertEqual(listing.json?["devices"]?.arrayValue?.first?.objectValue?["push"], ["service": "apns"])
    }

    /// SPEC section 10: a connection lost without a close handshake may
    /// not have received what was sent just before: the device gets a tap.
    func testAConnectionLostJustAfterAChangeGetsATapAndACleanCloseNone() {
        _ = register("u", "tablet", apns())
        let lost = h.webSocket()
        h.hello(lost, user: "u", device: "tablet")
        h.settle()
        let published = publish("u", "n1")
        dispatch()
        lost.read()
        XCTAssertEqual(changeSeqs(lost.frames), [1])
        XCTAssertEqual(transport.sent.count, 0, "connected: no push")
        h.clock.advance(seconds: 59)
        lost.session.transportClosed()
        dispatch()
        XCTAssertEqual(transport.sent.map(\.job.message.kind), [.tap])
        XCTAssertEqual(transport.sent.first?.job.message.cursor, 1)
        XCTAssertEqual(transport.sent.first?.job.message.notificationId, published.json?["notification"]?.objectValue?["id"]?.stringValue)
        transport.answerAll(.delivered)
        h.settle()

        // A clean close after a change, and a loss more than 60 s after one: nothing.
        let clean = h.webSocket()
        h.hello(clean, user: "u", device: "tablet")
        h.settle()
        _ = publish("u", "n2")
        h.settle()
        clean.session.receive(.close([]))
        clean.session.transportClosed()
        let late = h.webSocket()
        h.hello(late, user: "u", device: "tablet")
        h.settle()
        h.clock.advance(seconds: 61)
        late.session.transportClosed()
        dispatch()
        XCTAssertEqual(transport.sent.count, 1)
    }

    /// Two nodes on one store: the node that commits a change records its
    /// push, and whichever claims it sends it; never both.
    func testTwoNodesSendEachPushOnce() {
        let store = MemoryStore(), hub = MemoryBus.Hub()
        let otherTransport = HeldPushes()
        let a = Harness(store: store, bus: MemoryBus(hub: hub), apps: [Self.app], push: transport)
        let b = Harness(store: store, bus: MemoryBus(hub: hub), apps: [Self.app], push: otherTransport)
        for (i, node) in [a, b].enumerated() {
            let r = node.request("PUT", "/v1/me/devices/phone", token: node.token("u\(i)"), body: ["push": apns(String(repeating: "0\(i)", count: 32))])
            node.settle()
            XCTAssertEqual(r.response?.status, 200)
        }
        for k in 0..<20 {
            let node = k % 2 == 0 ? a : b
            node.request("POST", "/v1/apps/\(Self.app.id)/users/u\(k % 2)/notifications",
                         body: ["appNotificationId": .string("n\(k)"), "payload": ["title": "t", "body": "b"]])
        }
        for _ in 0..<3 {
            for node in [a, b] {
                node.settle()
                node.gateway.soleEngine.runMaintenance()
                node.settle()
            }
        }
        let sent = transport.sent + otherTransport.sent
        XCTAssertEqual(sent.count, 20)
        XCTAssertEqual(Set(sent.map(\.job.id)).count, 20, "none twice")
        XCTAssertEqual(Set(sent.map(\.job.message.cursor)), Set<Int64>(1...10), "each user's ten changes")
    }

    /// Two nodes on one store share one token (`SharedTokens`, what APNs
    /// provider tokens are kept in): the first to ask makes it, the other
    /// reads it, and once it is due the first to ask again renews it.
    func testTwoNodesShareOneTokenAndOneRenewsIt() {
        let store = MemoryStore(), hub = MemoryBus.Hub()
        let nodes = ["a", "b"].map { ($0, Harness(store: store, bus: MemoryBus(hub: hub), apps: [Self.app], push: HeldPushes())) }
        let made = Locked<[String]>([])
        func ask(_ node: Int) -> SharedToken? {
            let (name, h) = nodes[node]
            let got = Locked<SharedToken??>(nil)
            StoreTokens(engine: h.gateway.soleEngine).token("apns:T:K", renewAfter: 40 * 60_000, make: { now in
                made.withLock { $0.append(name) }
                return "\(name)@\(now)"
            }) { t in got.withLock { $0 = .some(t) } }
            h.settle()
            return got.withLock { $0 } ?? nil
        }
        func advance(seconds: Int64) { for (_, h) in nodes { h.clock.advance(seconds: seconds) } }
        let first = ask(0)
        XCTAssertNotNil(first)
        XCTAssertEqual(ask(1), first, "the other node reads it")
        advance(seconds: 40 * 60 - 1)
        XCTAssertEqual(ask(1), first, "not due yet")
        advance(seconds: 1)
        let renewed = ask(1)
        XCTAssertEqual(ask(0), renewed)
        XCTAssertEqual(renewed?.issuedAt, nodes[1].1.clock.now())
        XCTAssertEqual(made.withLock { $0 }, ["a", "b"], "one token made per renewal")
    }

    /// Found in review: the old token's death (APNs 410 for a push sent
    /// before the device registered a new one) must not take the pushes
    /// waiting for the new token.
    func testAnOldTokensDeathKeepsThePushesOfTheNewOne() {
        _ = register("u", "phone", apns())
        _ = publish("u", "n1")
        dispatch()
        XCTAssertEqual(transport.sent.count, 1)
        let fresh = String(repeating: "0c", count: 32)
        _ = register("u", "phone", apns(fresh))
        _ = publish("u", "n2")
        h.settle()
        transport.answerFirst(.unregistered("410 Unregistered", reason: "Unregistered"))
        dispatch()
        XCTAssertEqual(transport.sent.map(\.handle), [.apns(token: Self.apnsToken, environment: .production),
                                                     .apns(token: fresh, environment: .production)])
        let listing = h.request("GET", "/v1/apps/\(Self.app.id)/users/u/devices")
        h.settle()
        XCTAssertEqual(listing.json?["devices"]?.arrayValue?.first?.objectValue?["push"], ["service": "apns"], "the new handle stays")
    }
}
