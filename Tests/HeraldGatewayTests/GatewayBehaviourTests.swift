import HeraldPorts
import XCTest
import HeraldCore
import HeraldStores
@testable import HeraldGateway

/// The gateway in-process: what the engine, sessions, polls and streams do
/// on failures, limits and timers, driven step by step.
final class GatewayBehaviourTests: XCTestCase {
    let me = "/v1/me"

    // MARK: Rollback

    /// A failed commit answers 503 to every command of its batch, and
    /// nothing of them is visible or delivered.
    func testFailedCommitAnswers503ToTheWholeBatch() {
        let store = FailingStore()
        let h = Harness(store: store)
        let s = h.webSocket()
        h.hello(s, user: "u")
        h.settle(); s.read()
        store.failCommits = 1
        let answers = (0..<3).map { h.publish("u", "n\($0)") }
        h.settle(); s.read()
        XCTAssertEqual(answers.map { $0.response?.status }, [503, 503, 503])
        XCTAssertEqual(answers.map { $0.json?["error"]?.objectValue?["code"] }, ["unavailable", "unavailable", "unavailable"])
        XCTAssertEqual(answers.map { $0.response?.header("Retry-After") }, ["2", "2", "2"])
        XCTAssertEqual(changeSeqs(s.frames), [], "nothing of the batch was delivered")
        XCTAssertEqual(h.gateway.metrics.publishes.load(ordering: .relaxed), 0, "nor counted as published")
        let health = h.request("GET", "/healthz")
        XCTAssertEqual(health.json?["store"], "unavailable")
        let history = h.request("GET", "/v1/apps/\(Harness.app.id)/users/u/notifications")
        h.settle()
        XCTAssertEqual(history.json?["notifications"], [])
        // The next batch works, and its seq is the first: the failed one left no trace.
        let ok = h.publish("u", "after")
        h.settle(); s.read()
        XCTAssertEqual(ok.response?.status, 201)
        XCTAssertEqual(changeSeqs(s.frames), [1])
        XCTAssertEqual(h.gateway.metrics.publishes.load(ordering: .relaxed), 1)
        XCTAssertEqual(h.request("GET", "/healthz").json?["store"], "ok")
    }

    /// A batch that committed although its COMMIT's answer was lost is
    /// answered 503 "may have been made"; at the next commit the user's
    /// devices catch up from the store, so they get its change before the
    /// next one, once each, in seq order.
    func testAChangeThatCommittedUnseenIsDeliveredBeforeTheNextOne() {
        let store = FailingStore()
        let h = Harness(store: store)
        let s = h.webSocket()
        h.hello(s, user: "u")
        h.settle(); s.read()
        store.loseCommitAnswers = 1
        let lost = h.publish("u", "lost")
        h.settle(); s.read()
        XCTAssertEqual(lost.response?.status, 503)
        XCTAssertEqual(lost.json?["error"]?.objectValue?["message"], "storage became unavailable while saving; the change may have been made")
        XCTAssertEqual(changeSeqs(s.frames), [], "not delivered as if it had committed")
        let next = h.publish("u", "next")
        h.settle(); s.read()
        XCTAssertEqual(next.response?.status, 201)
        XCTAssertEqual(changeSeqs(s.frames), [1, 2])
        let again = h.publish("u", "lost")
        h.settle(); s.read()
        XCTAssertEqual(again.response?.status, 200, "repeating it replaces what did commit")
        XCTAssertEqual(changeSeqs(s.frames), [1, 2, 3])
    }

    /// A subscription whose admission batch failed is refused (1001 on a
    /// WebSocket) and leaves no follow behind.
    func testFailedAdmissionClosesAndFollowsNothing() {
        let (h, s) = helloOnFailingStore { $0.failCommits = 1 }
        XCTAssertEqual(s.session.closeRequest?.code, .goingAway)
        XCTAssertEqual(s.frames.last?["code"], "unavailable")
        assertFollows(h, 0, "nor a connection of its device")
    }

    /// A hello of device d1 of user u, its batch run once `failing` set up the store.
    private func helloOnFailingStore(_ failing: (FailingStore) -> Void) -> (Harness, RecordingSocket) {
        let store = FailingStore()
        let h = Harness(store: store)
        failing(store)
        let s = h.webSocket()
        h.hello(s, user: "u")
        h.settle(); s.read()
        return (h, s)
    }

    /// User u's followers, and its device d1's open WebSockets, are `n`.
    private func assertFollows(_ h: Harness, _ n: Int, _ why: String = "", line: UInt = #line) {
        let registry = h.gateway.soleEngine.registry, u = UserKey(app: Harness.app.id, user: "u")
        XCTAssertEqual(registry.followers(of: u), n, why, line: line)
        XCTAssertEqual(Int(registry.connections(u, device: "d1")?.websocket ?? 0), n, why, line: line)
    }

    /// An admission whose batch lost a conflict and ran again follows once:
    /// the rolled-back run's follow was taken back with its transaction.
    func testAnAdmissionRunAgainAfterAConflictFollowsOnce() {
        let (h, s) = helloOnFailingStore { $0.conflictCommits = 1 }
        XCTAssertEqual(s.frames.last?["type"], "welcome")
        XCTAssertEqual(h.gateway.metrics.storeConflictRetries.load(ordering: .relaxed), 1, "the batch ran twice")
        assertFollows(h, 1)
        s.session.transportClosed()
        h.settle()
        assertFollows(h, 0, "its release is the only undo, and undoes it all")
    }

    // MARK: Slow consumers

    /// Live changes past a connection's unsent-data limit are not queued:
    /// the connection catches up from the store as its client reads. A burst
    /// bigger than the limit in one commit (30 × 60 KB against 1 MiB) used
    /// to close a client that had read everything with 4008.
    func testABurstPastTheQueueLimitIsSentFromTheStoreAsTheClientReads() {
        var limits = GatewayLimits()
        limits.maxQueuedBytesPerConnection = 1 << 20
        let h = Harness(limits: limits)
        let s = h.webSocket()
        h.hello(s, user: "u")
        h.settle(); s.read()
        XCTAssertEqual(s.types, ["reset", "welcome"])
        for i in 0..<30 { h.publish("u", "big\(i)", payloadBytes: 60_000) }
        h.settle()
        XCTAssertNil(s.session.closeRequest)
        XCTAssertLessThanOrEqual(s.session.backlog, 1 << 20, "never more than the limit queued")
        XCTAssertEqual(h.gateway.metrics.deferredBursts.load(ordering: .relaxed), 1)
        for _ in 0..<30 where changeSeqs(s.frames).count < 30 {
            s.read()
            h.settle()
            XCTAssertLessThanOrEqual(s.session.backlog, 1 << 20)
        }
        XCTAssertEqual(changeSeqs(s.frames), Array(1...30), "every change, in order, once")
        h.publish("u", "after")
        h.settle()
        s.read()
        XCTAssertEqual(changeSeqs(s.frames), Array(1...31), "live again")
        XCTAssertNil(s.session.closeRequest)
    }

    /// A held poll's answer is a page, like a catch-up's: a read-all of 20
    /// notifications of 60 KB (one commit, one delivery of 20 changes) gives
    /// it about 1 MiB and `hasMore`, the next poll the rest.
    func testAHeldPollIsAnsweredAPageOfABurst() {
        let h = Harness()
        let tok = h.token("u")
        h.publishSettled("u", count: 20, payloadBytes: 60_000)
        let held = h.request("GET", "/v1/me/sync", token: tok, query: [("cursor", "20"), ("wait", "30")])
        h.settle()
        XCTAssertNil(held.response, "held")
        let readAll = h.request("POST", "/v1/me/notifications/read-all", token: tok)
        h.settle()
        XCTAssertEqual(readAll.response?.status, 200)
        let page = try! JSONParser.parse(held.response!.body).objectValue!
        let got = changeSeqs([["type": "changes", "changes": page["changes"]!]])
        XCTAssertEqual(got, Array(21...Int64(20 + got.count)))
        XCTAssertLessThan(got.count, 20)
        XCTAssertLessThanOrEqual(held.response!.body.count, HeldPoll.maxBytes + 70_000)
        XCTAssertEqual(page["hasMore"], true)
        XCTAssertEqual(page.int("cursor"), got.last)
        let rest = h.request("GET", "/v1/me/sync", token: tok, query: [("cursor", "\(got.last!)")])
        h.settle()
        let next = try! JSONParser.parse(rest.response!.body).objectValue!
        XCTAssertEqual(changeSeqs([["type": "changes", "changes": next["changes"]!]]).first, got.last! + 1)
    }

    /// Past `maxDevicesPerUser` a new device takes the place of the one not
    /// connected and seen longest ago; a connected one stays, however old.
    func testANewDevicePastTheLimitReplacesTheOneSeenLongestAgo() {
        var limits = GatewayLimits()
        limits.maxDevicesPerUser = 3
        let h = Harness(limits: limits)
        let tok = h.token("u")
        let s = h.webSocket()
        h.hello(s, user: "u", device: "d1")
        h.settle(); s.read()
        func put(_ id: String) {
            h.clock.advance(seconds: 1)
            let r = h.request("PUT", "/v1/me/devices/\(id)", token: tok, body: [:])
            h.settle()
            XCTAssertEqual(r.response?.status, 200)
        }
        func listed() -> [String] {
            let r = h.request("GET", "/v1/apps/\(Harness.app.id)/users/u/devices")
            h.settle()
            let devices = try! JSONParser.parse(r.response!.body).objectValue!["devices"]!.arrayValue!
            return devices.map { $0.objectValue!["deviceId"]!.stringValue! }.sorted()
        }
        put("d2"); put("d3")
        XCTAssertEqual(listed(), ["d1", "d2", "d3"])
        put("d4")
        XCTAssertEqual(listed(), ["d1", "d3", "d4"], "d2: not connected, seen longest ago")
        put("d5")
        XCTAssertEqual(listed(), ["d1", "d4", "d5"])
        XCTAssertNil(s.session.closeRequest, "the connected device stays")
        // Every registration connected: a new device is refused, nothing goes.
        let more = [h.webSocket(), h.webSocket()]
        h.hello(more[0], user: "u", device: "d4")
        h.hello(more[1], user: "u", device: "d5")
        h.settle()
        let refused = h.request("PUT", "/v1/me/devices/d6", token: tok, body: [:])
        h.settle()
        XCTAssertEqual(refused.response?.status, 429)
        XCTAssertEqual(listed(), ["d1", "d4", "d5"])
    }

    // MARK: Timers

    /// Setting the wall clock moves no interval: an hour forward drops no
    /// idle WebSocket (it used to hang up every one at once, as silent for
    /// an hour); an hour back holds no poll past its `wait`. A token's
    /// `exp` is wall time: set forward past it, the clock ends the connection.
    func testAStepOfTheWallClockMovesNoDeadline() {
        let h = Harness()
        let s = h.webSocket()
        h.hello(s, user: "u", ttl: 3 * 3600)
        h.settle(); s.read()
        let held = h.request("GET", "/v1/me/sync", token: h.token("u", ttl: 3 * 3600), query: [("cursor", "0"), ("wait", "30")])
        h.settle()
        XCTAssertNil(held.response, "held")
        h.clock.stepWall(seconds: 3600)
        h.shard.runTimers(); s.read()
        XCTAssertFalse(s.hungUp)
        XCTAssertNil(s.session.closeRequest)
        XCTAssertNil(held.response)
        h.clock.stepWall(seconds: -7200)
        h.clock.advance(seconds: 30)
        h.shard.runTimers(); s.read()
        XCTAssertEqual(held.response?.status, 200, "answered empty at its wait")
        XCTAssertEqual(s.controls, [9], "pinged after 30 s of silence, as if the clock had not moved")
        XCTAssertFalse(s.hungUp)
        h.clock.stepWall(seconds: 4 * 3600)
        h.shard.runTimers()
        XCTAssertEqual(s.session.closeRequest?.reason, "token expired")
    }

    /// A client that keeps sending but never reads is never silent, and
    /// live changes past its queue limit wait in the store: the socket
    /// taking none of its output for `writeTimeoutSeconds` ends it (at a
    /// keep-alive), counted as a slow consumer. One that reads stays.
    func testAClientThatSendsButNeverReadsIsHungUp() {
        let h = Harness()
        let stuck = h.webSocket(), reading = h.webSocket()
        h.hello(stuck, user: "u", device: "stuck")
        h.hello(reading, user: "u", device: "reading")
        h.settle(); stuck.read(); reading.read()
        h.publish("u", "waits")
        h.settle()
        for _ in 0..<6 {
            h.clock.advance(seconds: 10)
            for s in [stuck, reading] {
                s.session.heard()
                s.session.receive(.text(Array(#"{"type":"ping","ref":"p"}"#.utf8)))
            }
            h.shard.runTimers()
            reading.read()
        }
        XCTAssertTrue(stuck.hungUp, "no write progress for over 30 s")
        XCTAssertFalse(reading.hungUp)
        XCTAssertTrue(h.gateway.metrics.prometheusText().contains(#"herald_dropped_connections_total{reason="slow_consumer"} 1"#))
    }

    /// A client reading a long backlog slowly, saying nothing (its pong waits
    /// behind the backlog), is not dropped as idle while the socket takes
    /// its output; once nothing moves either way, it is.
    func testASlowReaderIsNotIdleWhileItsSocketTakesOutput() {
        let h = Harness()
        let s = h.webSocket()
        h.hello(s, user: "u")
        h.settle(); s.read()
        h.publishSettled("u", count: 60, payloadBytes: 60_000)  // ~3.6 MB queued
        var rounds = 0
        while s.session.hasPendingOutput && rounds < 20 {  // a frame every 20 s
            h.clock.advance(seconds: 20)
            var frame: [UInt8] = []
            s.session.writePending(into: &frame, limit: 1)
            h.shard.runTimers()
            XCTAssertFalse(s.hungUp, "reading, however slowly (round \(rounds))")
            rounds += 1
        }
        XCTAssertGreaterThan(rounds * 20, 45, "longer than the idle limit")
        for _ in 0..<8 {
            h.clock.advance(seconds: 10)
            h.shard.runTimers()
        }
        XCTAssertTrue(s.hungUp, "nothing read nor heard")
    }

    func testHelloDeadline() {
        let h = Harness()
        let s = h.webSocket()
        h.clock.advance(seconds: 9)
        h.shard.runTimers()
        XCTAssertNil(s.session.closeRequest)
        h.clock.advance(seconds: 1)
        h.shard.runTimers()
        XCTAssertEqual(s.session.closeRequest?.code, .unauthenticated)
    }

    /// A silent client is pinged after `pingIntervalSeconds` and dropped
    /// (counted as idle) after `idleHangupSeconds`; anything it sends, a pong
    /// included, starts the count again.
    func testSilentClientsArePingedThenDropped() {
        let h = Harness()
        let s = h.webSocket()
        h.hello(s, user: "u")
        h.settle(); s.read()
        h.clock.advance(seconds: 29); h.shard.runTimers(); s.read()
        XCTAssertEqual(s.controls, [])
        h.clock.advance(seconds: 1); h.shard.runTimers(); s.read()
        XCTAssertEqual(s.controls, [9], "a ping after 30 s of silence")
        h.clock.advance(seconds: 10)
        s.session.heard() // the pong
        h.clock.advance(seconds: 10); h.shard.runTimers(); s.read()
        XCTAssertFalse(s.hungUp)
        XCTAssertEqual(s.controls, [9])
        h.clock.advance(seconds: 20); h.shard.runTimers(); s.read()
        XCTAssertEqual(s.controls, [9, 9], "30 s after the pong, the next ping")
        h.clock.advance(seconds: 14); h.shard.runTimers()
        XCTAssertFalse(s.hungUp)
        h.clock.advance(seconds: 1); h.shard.runTimers()
        XCTAssertTrue(s.hungUp, "45 s of silence")
        XCTAssertTrue(h.gateway.metrics.prometheusText().contains(#"herald_dropped_connections_total{reason="idle"} 1"#))
    }

    /// A connection being closed is hung up on after `idleHangupSeconds`
    /// even if the client keeps sending: only its close frame ends it sooner.
    func testClosingConnectionsAreHungUpOnEvenIfTheClientTalks() {
        let h = Harness()
        let s = h.webSocket()
        h.hello(s, user: "u")
        h.settle()
        s.session.shutdown()
        for _ in 0..<9 {
            h.clock.advance(seconds: 5)
            s.session.heard()
            h.shard.runTimers()
        }
        XCTAssertTrue(s.hungUp)
    }

    /// Pings are answered with their payload; a client's close frame is
    /// answered with ours (1000), a protocol error with 1002.
    func testPingsAndClosesFromTheClient() {
        let h = Harness()
        let s = h.webSocket()
        s.session.ping([1, 2, 3])
        s.read()
        XCTAssertEqual(s.controls, [10])
        s.session.receive(.close([]))
        XCTAssertEqual(s.session.closeRequest?.code, .normal)
        let t = h.webSocket()
        t.session.receive(.protocolError("client frames must be masked"))
        XCTAssertEqual(t.session.closeRequest?.code, .protocolError)
        // What the close frame holds decides the answer (WebSocketFramesTests has each case).
        for (body, code) in [([3, 232, 0xff], CloseCode.invalidPayload), ([3, 237], .protocolError), ([3, 232], .normal)] as [([UInt8], CloseCode)] {
            let c = h.webSocket()
            c.session.receive(.close(body))
            XCTAssertEqual(c.session.closeRequest?.code, code, "\(body)")
        }
    }

    /// A client's pings and unsolicited pongs take from the message budget
    /// (50 a second, bursts of 100, the hello included): past it, 4008. The
    /// pong that answers our keep-alive ping is free.
    func testControlFramesCountAgainstTheMessageRate() {
        let h = Harness()
        let s = h.webSocket()
        h.hello(s, user: "u")
        h.settle(); s.read()
        for i in 0..<99 { s.session.ping([UInt8(i)]) }
        s.read()
        XCTAssertEqual(s.controls, Array(repeating: 10, count: 99))
        XCTAssertNil(s.session.closeRequest)
        s.session.ping([])
        s.read()
        XCTAssertEqual(s.session.closeRequest?.code, .policy)
        XCTAssertEqual(s.controls.count, 99, "the ping past the budget gets no pong")

        let t = h.webSocket()
        h.hello(t, user: "u", device: "d2")
        h.settle(); t.read()
        h.clock.advance(seconds: 30); h.shard.runTimers(); t.read()
        XCTAssertEqual(t.controls, [9], "our keep-alive ping; the budget is full again")
        for _ in 0..<101 { t.session.pong() }
        XCTAssertNil(t.session.closeRequest, "the answer to our ping, then 100 unsolicited")
        t.session.pong()
        XCTAssertEqual(t.session.closeRequest?.code, .policy)
        XCTAssertTrue(h.gateway.metrics.prometheusText().contains(#"herald_dropped_connections_total{reason="rate_limited"} 2"#))
    }

    /// tokenExpiring 60 s before exp; at exp without a refresh, 4001. A
    /// refresh moves both.
    func testTokenWarningExpiryAndRefresh() {
        let h = Harness()
        let s = h.webSocket()
        h.hello(s, user: "u", ttl: 120)
        h.settle(); s.read()
        h.clock.advance(seconds: 59); h.shard.runTimers(); s.read()
        XCTAssertEqual(s.types, ["reset", "welcome"])
        h.clock.advance(seconds: 1); h.shard.runTimers(); s.read()
        XCTAssertEqual(s.types.last, "tokenExpiring")
        let fresh = h.token("u", ttl: 600)
        s.session.receive(.text(Array(#"{"type":"refresh","ref":"r","token":"\#(fresh)"}"#.utf8)))
        s.read()
        XCTAssertEqual(s.types.last, "ack")
        h.clock.advance(seconds: 60); h.shard.runTimers()
        XCTAssertNil(s.session.closeRequest, "the old token's expiry no longer applies")
        h.clock.advance(seconds: 600); h.shard.runTimers()
        XCTAssertEqual(s.session.closeRequest?.code, .unauthenticated)
    }

    /// A held poll answers on the first visible change, or empty at its
    /// deadline with the cursor moved past what it may not see.
    func testHeldPollDeadlineAndWakeUp() {
        let h = Harness()
        let tok = h.token("u")
        h.publishSettled("u", count: 1)
        let held = h.request("GET", me + "/sync", token: tok, query: [("cursor", "1"), ("wait", "5")])
        h.settle()
        XCTAssertNil(held.response)
        h.clock.advance(seconds: 4); h.shard.runTimers(); h.settle()
        XCTAssertNil(held.response)
        h.clock.advance(seconds: 1); h.shard.runTimers(); h.settle()
        XCTAssertEqual(held.json?["changes"], [])
        XCTAssertEqual(held.json?.int("cursor"), 1)

        let woken = h.request("GET", me + "/sync", token: tok, query: [("cursor", "1"), ("wait", "30")])
        h.settle()
        h.publish("u", "wake")
        h.settle()
        XCTAssertEqual(woken.json?["changes"]?.arrayValue?.count, 1)
        XCTAssertEqual(woken.json?.int("cursor"), 2)
        XCTAssertEqual(h.gateway.heldPolls.load(ordering: .relaxed), 0)
    }

    // MARK: Limits

    /// The per-user connection limit counts WebSockets, event streams and
    /// held polls alike; polls answered at once do not count.
    func testConnectionLimitAppliesToEveryTransport() {
        var limits = GatewayLimits()
        limits.maxConnectionsPerUser = 2
        let h = Harness(limits: limits)
        let tok = h.token("u")
        let a = h.webSocket(); h.hello(a, user: "u", device: "a")
        let poll = h.request("GET", me + "/sync", token: tok, query: [("cursor", "0"), ("wait", "30")])
        h.settle()
        XCTAssertNil(poll.response, "held")
        // Full: a third of any kind is refused.
        let ws = h.webSocket(); h.hello(ws, user: "u", device: "c")
        let sse = h.request("GET", me + "/events", token: tok)
        let poll2 = h.request("GET", me + "/sync", token: tok, query: [("cursor", "0"), ("wait", "30")])
        let quick = h.request("GET", me + "/sync", token: tok)
        h.settle(); ws.read()
        XCTAssertEqual(ws.session.closeRequest?.code, .policy)
        XCTAssertEqual(ws.frames.last?["code"], "rate_limited")
        XCTAssertEqual(sse.response?.status, 429)
        XCTAssertEqual(poll2.response?.status, 429)
        XCTAssertNotNil(sse.response?.headers.first { $0.0 == "Retry-After" })
        XCTAssertEqual(quick.response?.status, 200, "a poll that does not wait is no connection")
        // One leaves: a slot frees up.
        poll.disconnect()
        h.settle()
        let sse2 = h.request("GET", me + "/events", token: tok)
        h.settle()
        XCTAssertTrue(sse2.streamStarted)
    }

    /// A device that reconnects at once, before the engine ran anything of
    /// its old connection's close, fits under the limit: the close counts
    /// first, though both land in one batch and the close's batch may still
    /// wait for its sync.
    func testAReconnectRightAfterACloseFitsUnderTheLimit() {
        var limits = GatewayLimits()
        limits.maxConnectionsPerUser = 1
        let h = Harness(limits: limits)
        let old = h.webSocket(); h.hello(old, user: "u", device: "a")
        h.settle(); old.read()
        XCTAssertEqual(old.types, ["reset", "welcome"])
        old.session.transportClosed()
        let new = h.webSocket(); h.hello(new, user: "u", device: "a")
        h.settle(); new.read()
        XCTAssertNil(new.session.closeRequest, "refused: \(new.frames)")
        XCTAssertEqual(new.types, ["reset", "welcome"])
        // The limit still holds for a second connection beside it.
        let third = h.webSocket(); h.hello(third, user: "u", device: "b")
        h.settle(); third.read()
        XCTAssertEqual(third.session.closeRequest?.code, .policy)
    }

    /// A send by tags learns its users only as it runs and claims them then,
    /// so it runs in a batch of its own: every batch takes its locks in one
    /// claim (docs/ARCHITECTURE.md, PostgreSQL). Commands around it batch
    /// as before.
    func testASendByTagsRunsInABatchOfItsOwn() {
        let store = FailingStore()
        let h = Harness(store: store)
        let device = h.request("PUT", me + "/devices/d", token: h.token("u2"), body: ["tags": ["vip"]])
        h.settle()
        XCTAssertEqual(device.response?.status, 200)
        let before = store.commits.load(ordering: .relaxed)
        let first = h.publish("u1", "a")
        let send = h.request("POST", "/v1/apps/\(Harness.app.id)/notifications",
                             body: ["tagExpression": "vip", "appNotificationId": "t", "payload": [:]])
        let after = [h.publish("u3", "b"), h.publish("u4", "c")]
        h.runEngine()
        XCTAssertEqual(store.commits.load(ordering: .relaxed) - before, 3, "the publish, the send, the two publishes after it")
        h.settle()
        XCTAssertEqual(([first] + after).map { $0.response?.status }, [201, 201, 201])
        XCTAssertEqual(send.response?.status, 202)
        XCTAssertEqual(send.json?.int("users"), 1)
    }

    /// What is queued when the gateway stops all runs, though a send by tags
    /// splits it into several batches.
    func testCommandsQueuedAtStopAllRunThoughASendByTagsSplitsThem() {
        let h = Harness()
        let device = h.request("PUT", me + "/devices/d", token: h.token("u2"), body: ["tags": ["vip"]])
        h.settle()
        XCTAssertEqual(device.response?.status, 200)
        let first = h.publish("u1", "a")
        let send = h.request("POST", "/v1/apps/\(Harness.app.id)/notifications",
                             body: ["tagExpression": "vip", "appNotificationId": "t", "payload": [:]])
        let last = h.publish("u3", "b")
        // Stopping before the engine's thread starts: it finds `stopping` set
        // with the three queued, and must not leave after the first batch.
        let engine = h.gateway.soleEngine
        engine.stop()
        engine.start()
        engine.stop()
        h.loop.drain()
        XCTAssertEqual([first, send, last].map { $0.response?.status }, [201, 202, 201])
    }

    /// An event stream pages its catch-up as the client reads, and a client
    /// that goes away releases its follow and its listing.
    func testEventStreamPagesAndReleases() {
        let h = Harness()
        h.publishSettled("u", count: 40, payloadBytes: 60_000)
        let tok = h.token("u")
        let sse = h.request("GET", me + "/events", token: tok, device: "d", query: [("cursor", "0")])
        h.settle()
        XCTAssertLessThan(sse.queuedBytes, Subscription.drainedBelow + 2 * PageBounds.webSocket.bytes)
        while sse.events.count < 40 { sse.read(); h.settle() }
        XCTAssertEqual(sse.events.map(\.id), Array(1...40))
        let listing = h.request("GET", "/v1/apps/\(Harness.app.id)/users/u/devices")
        h.settle()
        XCTAssertEqual(listing.json?["devices"]?.arrayValue?.first?.objectValue?["transport"], "sse")
        sse.disconnect()
        h.settle()
        let after = h.request("GET", "/v1/apps/\(Harness.app.id)/users/u/devices")
        h.settle()
        XCTAssertEqual(after.json?["devices"]?.arrayValue?.first?.objectValue?["connected"], false)
        XCTAssertEqual(h.gateway.soleEngine.registry.followers(of: UserKey(app: Harness.app.id, user: "u")), 0)
    }

    /// Counts come from the stores' per-targeting counts, viewer by viewer.
    func testCountsFollowStateChanges() {
        let h = Harness()
        h.publishSettled("u", count: 5)
        let tok = h.token("u")
        let page = h.request("GET", me + "/notifications", token: tok)
        h.settle()
        let id = page.json!["notifications"]!.arrayValue![0].objectValue!["id"]!.stringValue!
        let patch = h.request("PATCH", me + "/notifications/\(id)", token: tok,
                              body: ["readState": "read", "userActionState": "dismissed"])
        h.settle()
        XCTAssertEqual(patch.response?.status, 200)
        let counts = h.request("GET", me + "/counts", token: tok)
        h.settle()
        XCTAssertEqual(counts.json, ["unread": 4, "unseen": 4, "noInteraction": 4, "total": 5])
    }
}

extension GatewayBehaviourTests {
    /// Shutdown reaches subscriptions whose admission is still on the
    /// engine: the WebSocket closes 1001, a poll or stream not yet started
    /// is told to retry (503), and no follow is left behind.
    func testShutdownEndsSubscriptionsStillBeingAdmitted() {
        let h = Harness()
        let tok = h.token("u")
        let s = h.webSocket()
        h.hello(s, user: "u")
        let poll = h.request("GET", me + "/sync", token: tok, query: [("cursor", "0"), ("wait", "30")])
        let sse = h.request("GET", me + "/events", token: tok)
        h.shard.shutdownSubscriptions()
        h.settle(); s.read()
        XCTAssertEqual(s.session.closeRequest?.code, .goingAway)
        XCTAssertEqual(poll.response?.status, 503)
        XCTAssertEqual(sse.response?.status, 503)
        XCTAssertFalse(sse.streamStarted)
        XCTAssertEqual(h.gateway.soleEngine.registry.followers(of: UserKey(app: Harness.app.id, user: "u")), 0)
    }
}

extension GatewayBehaviourTests {
    /// Timers of closed connections and of replaced tokens do not pile up
    /// until they are due (a token timer may be weeks away).
    func testTimersOfClosedConnectionsAndRefreshesAreDropped() {
        let h = Harness()
        for i in 0..<300 {
            let s = h.webSocket()
            h.hello(s, user: "u\(i % 10)", device: "d\(i)", ttl: 20 * 86_400)
            h.settle(); s.read()
            s.session.transportClosed()
        }
        h.settle()
        XCTAssertLessThan(h.shard.pendingTimers, 70, "closed connections leave no timers behind")
        let s = h.webSocket()
        h.hello(s, user: "u", ttl: 20 * 86_400)
        h.settle(); s.read()
        let before = h.shard.pendingTimers
        for i in 0..<50 {
            let t = h.token("u", ttl: 20 * 86_400 + Int64(i))
            s.session.receive(.text(Array(#"{"type":"refresh","ref":"r\#(i)","token":"\#(t)"}"#.utf8)))
            h.clock.advance(seconds: 1)
        }
        s.read()
        XCTAssertEqual(s.frames.filter { $0["type"] == "ack" }.count, 50)
        XCTAssertEqual(h.shard.pendingTimers, before, "a refresh replaces the token timer")
    }
}

extension GatewayBehaviourTests {
    /// A backlog of old changes is pruned in calls of a bounded size, spaced
    /// apart, not in one call that holds the engine (and every publish
    /// behind it) for as long as the whole backlog takes; the next round
    /// comes a minute later.
    func testPruningABacklogTakesBoundedCallsSpacedApart() throws {
        let store = FailingStore()
        let h = Harness(store: store)
        let user = UserKey(app: Harness.app.id, user: "u")
        let backlog = 2 * Maintenance.pruneChunk + 1
        var n = HeraldCore.Notification(id: "n_1", appNotificationId: "a1", userId: "u", payload: [:], createdAt: h.clock.now(),
                             updatedAt: h.clock.now(), expiresAt: h.clock.now() + 365 * 86_400_000)
        var previous: HeraldCore.Notification? = nil
        for _ in 0..<backlog {
            _ = try store.inner.upsert(user, n, previous: previous, at: h.clock.now())
            previous = n
            n.version += 1
        }
        h.clock.advance(seconds: 8 * 86_400)  // past the 7 days' retention
        let engine = h.gateway.soleEngine
        let calls = { store.pruneCalls.load(ordering: .relaxed) }
        let before = calls()

        engine.runMaintenance()
        XCTAssertEqual(calls() - before, 1)
        XCTAssertEqual(try store.feed(user).floor, Int64(Maintenance.pruneChunk), "one call takes at most its limit")
        engine.runMaintenance()
        XCTAssertEqual(calls() - before, 1, "the next call waits its turn")
        h.clock.advance(millis: Maintenance.pruneChunkSpacing)
        engine.runMaintenance()
        XCTAssertEqual(try store.feed(user).floor, Int64(2 * Maintenance.pruneChunk))
        h.clock.advance(millis: Maintenance.pruneChunkSpacing)
        engine.runMaintenance()
        XCTAssertEqual(calls() - before, 3)
        XCTAssertEqual(try store.feed(user), FeedState(head: Int64(backlog), floor: Int64(backlog)), "the backlog is gone")
        XCTAssertEqual(try store.notification(user, id: "n_1")?.version, Int64(backlog), "the notification stays")

        h.clock.advance(seconds: 1)
        engine.runMaintenance()
        XCTAssertEqual(calls() - before, 3, "the round is over")
        h.clock.advance(millis: Maintenance.pruneEvery)
        engine.runMaintenance()
        XCTAssertEqual(calls() - before, 4, "the next round, a minute later")
    }

    /// A harness over `store` with a device of user u connected, and a
    /// notification of u that expires in 1 s.
    private func expiringNotification(_ store: FailingStore) -> (Harness, RecordingSocket) {
        let h = Harness(store: store)
        let s = h.webSocket()
        h.hello(s, user: "u", cursor: 0)
        h.request("POST", "/v1/apps/\(Harness.app.id)/users/u/notifications",
                  body: ["appNotificationId": "a1", "payload": [:], "ttlSeconds": 1])
        h.settle()
        return (h, s)
    }

    /// The expiry check every 250 ms asks the store's reader thread, not the
    /// engine: the engine's store sweeps only once a notification is due,
    /// and the device is told it expired.
    func testTheExpiryCheckReadsOffTheEngineAndSweepsOnlyWhenDue() {
        let store = FailingStore()
        store.offersReader = true
        let (h, s) = expiringNotification(store)
        let sweeps = { store.expiringCalls.load(ordering: .relaxed) }
        let engine = h.gateway.soleEngine
        for _ in 0..<3 {
            engine.runMaintenance()
            h.settle()
            h.clock.advance(millis: Maintenance.sweepEvery)
        }
        XCTAssertEqual(sweeps(), 0, "nothing due: the engine's store is not asked")
        h.clock.advance(seconds: 1)
        engine.runMaintenance()
        XCTAssertEqual(sweeps(), 0, "the question waits on the reader thread")
        h.settle()
        engine.runMaintenance()
        h.settle()
        XCTAssertEqual(sweeps(), 1, "a notification is due: one sweep")
        s.read()
        let change = s.frames.last { $0["type"] == "change" }?["change"]?.objectValue
        XCTAssertEqual(change?["op"], "delete")
        XCTAssertEqual(change?["reason"], "expired")
    }

    /// The planner statistics check (an ANALYZE of a grown table takes tens
    /// of milliseconds on PostgreSQL) runs on the reader thread, one at a
    /// time, every 5 s.
    func testThePlannerStatisticsCheckRunsOffTheEngine() {
        let store = FailingStore()
        store.offersReader = true
        let h = Harness(store: store)
        let checks = { store.statisticsChecks.load(ordering: .relaxed) }
        let engine = h.gateway.soleEngine
        h.settle()
        let before = checks()
        h.clock.advance(millis: Maintenance.statisticsEvery)
        engine.runMaintenance()
        XCTAssertEqual(checks(), before, "the check waits on the reader thread")
        h.clock.advance(millis: Maintenance.statisticsEvery)
        engine.runMaintenance()
        h.settle()
        XCTAssertEqual(checks(), before + 1, "one at a time")
        h.clock.advance(millis: Maintenance.statisticsEvery)
        engine.runMaintenance()
        h.settle()
        XCTAssertEqual(checks(), before + 2)
    }

    /// A maintenance transaction that loses a conflict (a head another node
    /// moved since this one cached it) runs again, as a batch does, and the
    /// store is not taken for failing.
    func testAMaintenanceTransactionThatLosesAConflictRunsAgain() {
        let store = FailingStore()
        let (h, s) = expiringNotification(store)
        h.clock.advance(seconds: 2)
        store.conflictCommits = 1
        h.gateway.soleEngine.runMaintenance()
        h.settle()
        XCTAssertEqual(store.expiringCalls.load(ordering: .relaxed), 2, "swept, then swept again")
        XCTAssertEqual(h.gateway.metrics.storeConflictRetries.load(ordering: .relaxed), 1)
        XCTAssertTrue(h.gateway.soleEngine.health.isAvailable)
        s.read()
        let change = s.frames.last { $0["type"] == "change" }?["change"]?.objectValue
        XCTAssertEqual(change?["reason"], "expired", "announced once it committed")
        XCTAssertEqual(s.frames.filter { $0["change"]?.objectValue?["reason"] == "expired" }.count, 1, "announced once")
    }

    /// A lastSeen flush that loses a conflict at its COMMIT runs again and
    /// still saves what it was to save: the first try's bookkeeping (the
    /// devices it took for saved) is undone with it.
    func testALastSeenFlushThatLosesAConflictSavesWhenItRunsAgain() throws {
        let store = FailingStore()
        let h = Harness(store: store)
        let tok = h.token("u")
        _ = h.request("GET", me + "/sync", token: tok, device: "d1")
        h.settle()
        h.clock.advance(seconds: 5)
        let seen = h.clock.now()
        _ = h.request("GET", me + "/sync", token: tok, device: "d1")
        h.settle()
        let stored = { try store.inner.devices(UserKey(app: Harness.app.id, user: "u")).first?.lastSeenAt }
        XCTAssertLessThan(try stored() ?? 0, seen, "not saved before the flush")
        h.clock.advance(seconds: 31)
        store.conflictCommits = 1
        h.gateway.soleEngine.runMaintenance()
        XCTAssertEqual(h.gateway.metrics.storeConflictRetries.load(ordering: .relaxed), 1)
        XCTAssertEqual(try stored(), seen)
    }

    /// A check the reader thread does not answer (its queue long with
    /// catch-ups) gives way to a sweep on the engine after a second, so
    /// expiry stays within SPEC's 2 s.
    func testAnUnansweredExpiryCheckGivesWayToASweep() {
        let store = FailingStore()
        store.offersReader = true
        let h = Harness(store: store)
        h.request("POST", "/v1/apps/\(Harness.app.id)/users/u/notifications",
                  body: ["appNotificationId": "a1", "payload": [:], "ttlSeconds": 1])
        h.settle()
        h.clock.advance(seconds: 2)
        let engine = h.gateway.soleEngine
        let sweeps = { store.expiringCalls.load(ordering: .relaxed) }
        engine.runMaintenance()  // asks the reader, which is not run
        var waited: Millis = 0
        while waited + Maintenance.sweepEvery < Maintenance.checkPatience {
            h.clock.advance(millis: Maintenance.sweepEvery)
            waited += Maintenance.sweepEvery
            engine.runMaintenance()
        }
        XCTAssertEqual(sweeps(), 0, "the question is still fresh")
        h.clock.advance(millis: Maintenance.sweepEvery)
        engine.runMaintenance()
        XCTAssertEqual(sweeps(), 1, "swept on the engine")
        XCTAssertNil(try store.notification(UserKey(app: Harness.app.id, user: "u"), appNotificationId: "a1"))
        h.clock.advance(millis: Maintenance.sweepEvery)
        engine.runMaintenance()
        XCTAssertEqual(sweeps(), 1, "once per patience, not at every tick")
    }

    /// A failed expiry check on the reader thread shows in the store's
    /// health: the engine batch that hands the failure back touches no store
    /// and must not report it working (/healthz said `ok` with PostgreSQL
    /// stopped).
    func testAFailedReadAsideLeavesTheStoreUnhealthy() {
        let store = FailingStore()
        store.offersReader = true
        let h = Harness(store: store)
        store.failExpiryChecks = 1
        h.gateway.soleEngine.runMaintenance()
        h.settle()
        XCTAssertFalse(h.gateway.soleEngine.health.isAvailable)
        h.clock.advance(millis: Maintenance.sweepEvery)
        h.gateway.soleEngine.runMaintenance()
        h.settle()
        XCTAssertTrue(h.gateway.soleEngine.health.isAvailable, "the next check was answered")
    }

    /// A registration read before a newer change of the device (the device
    /// audit reads aside) does not undo it: a connection whose view differs
    /// from the read has the engine read it again, and keeps the newer one.
    func testAnOlderReadDoesNotReplaceANewerView() {
        let h = Harness()
        let s = h.webSocket()
        h.hello(s, user: "u", cursor: 0)
        h.settle()
        let put = h.request("PUT", me + "/devices/d1", token: h.token("u"), body: ["platform": "android"])
        h.settle()
        XCTAssertEqual(put.json?["device"]?.objectValue?["platform"], "android")
        let user = UserKey(app: Harness.app.id, user: "u")
        let stale = Viewer(userId: "u", device: Device(deviceId: "d1", platform: .other, lastSeenAt: 0, viewGeneration: 0))
        h.shard.checkViewer(user, deviceId: "d1", read: stale)
        h.request("POST", "/v1/apps/\(Harness.app.id)/users/u/notifications",
                  body: ["appNotificationId": "android-only", "payload": [:], "targetPlatforms": ["android"]])
        h.settle()
        s.read()
        XCTAssertEqual(changeSeqs(s.frames), [1], "still android")
    }

    /// The registry forgets devices that went away once their lastSeenAt is
    /// in the store; the listing still shows it.
    func testRegistryForgetsDevicesThatLeft() {
        let h = Harness()
        let tok = h.token("u")
        for i in 0..<20 { _ = h.request("GET", me + "/sync", token: tok, device: "d\(i)") }
        h.settle()
        XCTAssertEqual(h.gateway.soleEngine.registry.knownDevices, 20)
        h.clock.advance(seconds: 61)
        h.gateway.soleEngine.runMaintenance(force: true)
        XCTAssertEqual(h.gateway.soleEngine.registry.knownDevices, 0)
        let listing = h.request("GET", "/v1/apps/\(Harness.app.id)/users/u/devices")
        h.settle()
        let devices = listing.json?["devices"]?.arrayValue ?? []
        XCTAssertEqual(devices.count, 20)
        XCTAssertTrue(devices.allSatisfy { $0.objectValue?["connected"] == false && $0.objectValue?["lastSeenAt"] != nil })
    }
}
