import HeraldPorts
import XCTest
import HeraldCore
import HeraldStores
@testable import HeraldGateway

/// Two nodes in-process on one store and a `MemoryBus`: changes cross over
/// through the engine's one fan-out, and a lost bus message or a lost bus
/// is caught up from the store, on the same connection, in order, once.
final class BusTests: XCTestCase {
    /// Set before the first use of `a` or `b`.
    var store: NotificationStore = MemoryStore()
    let hub = MemoryBus.Hub()
    lazy var busA = MemoryBus(hub: hub)
    lazy var busB = MemoryBus(hub: hub)
    lazy var a = Harness(store: store, bus: busA)
    lazy var b = Harness(store: store, bus: busB)

    func settle() { for _ in 0..<3 { a.settle(); b.settle() } }

    /// A device on node B, welcomed.
    func deviceOnB() -> RecordingSocket {
        let s = b.webSocket()
        b.hello(s, user: "u", cursor: 0)
        settle()
        s.read()
        XCTAssertTrue(s.types.contains("welcome"))
        return s
    }

    /// What the device was sent, read.
    func seqs(_ s: RecordingSocket) -> [Int64] {
        s.read()
        return changeSeqs(s.frames)
    }

    func testAChangeOnOneNodeReachesADeviceOnTheOther() {
        let s = deviceOnB()
        for i in 0..<5 { a.publish("u", "n\(i)") }
        b.publish("u", "from-b")
        settle()
        XCTAssertEqual(seqs(s), Array(1...6), "both nodes' changes, in order, once")
    }

    /// A batch flushes once: publishes committed together take one bus
    /// write and one post to the shard, which carries the deliveries and
    /// then the replies.
    func testABatchOfPublishesTakesOneBusWriteAndOnePostPerShard() {
        let local = a.webSocket()
        a.hello(local, user: "u", cursor: 0)
        let remote = deviceOnB()
        let writes = busA.recordWrites.load(ordering: .relaxed)
        let answers = (0..<5).map { a.publish("u", "n\($0)") }
        let posts = a.loop.capture { a.runEngine() }
        XCTAssertEqual(posts.count, 1, "one post to the shard")
        XCTAssertEqual(busA.recordWrites.load(ordering: .relaxed) - writes, 1, "one bus write")
        XCTAssertTrue(answers.allSatisfy { $0.response == nil }, "nothing answered before the post runs")
        a.loop.post(contentsOf: posts)
        settle()
        XCTAssertEqual(answers.map { $0.response?.status }, Array(repeating: 201, count: 5))
        XCTAssertEqual(seqs(local), Array(1...5))
        XCTAssertEqual(seqs(remote), Array(1...5), "the one bus write carried all five")
    }

    /// A message lost on the bus shows as a gap at the user's next change.
    func testAMissedMessageIsCaughtUpAtTheNextChange() {
        let s = deviceOnB()
        a.publish("u", "seen")
        settle()
        busA.disconnect()
        a.publish("u", "lost")
        settle()
        XCTAssertEqual(seqs(s), [1])
        busA.reconnect()
        a.publish("u", "after")
        settle()
        XCTAssertEqual(seqs(s), [1, 2, 3], "the lost change from the store, then the rest")
        XCTAssertNil(s.session.closeRequest, "no reconnect needed")
    }

    /// A resubscription catches every device up, even with no later change.
    func testAResubscriptionCatchesUpWhatWasMissed() {
        let s = deviceOnB()
        busB.disconnect()
        a.publish("u", "missed")
        settle()
        XCTAssertEqual(seqs(s), [])
        busB.reconnect()
        settle()
        XCTAssertEqual(seqs(s), [1])
        a.publish("u", "live")
        settle()
        XCTAssertEqual(seqs(s), [1, 2])
        // The resubscription read the head it caught up to: neither the next
        // record nor the feed audit took the missed change for a gap again.
        audit(b)
        b.clock.advance(millis: FeedAudit.grace)
        audit(b)
        XCTAssertEqual(b.gateway.metrics.bus.catchUps.load(ordering: .relaxed), 0)
        XCTAssertEqual(b.gateway.metrics.bus.missed.load(ordering: .relaxed), 0)
    }

    /// Runs `node`'s maintenance, feed audit included, and what it queued.
    func audit(_ node: Harness) {
        node.gateway.soleEngine.runMaintenance()
        settle()
    }

    /// A change that never came over the bus (its node died between commit
    /// and publish) reaches the devices here without a later change: the
    /// feed audit finds the head past what was delivered and, once it stays
    /// so for the grace, catches the followers up from the store.
    func testAChangeThatNeverCameOverTheBusArrivesWithoutALaterChange() {
        let s = deviceOnB()
        busA.disconnect()
        a.publish("u", "never-on-the-bus")
        settle()
        audit(b)
        XCTAssertEqual(seqs(s), [], "within the grace a record may still be on its way")
        b.clock.advance(millis: FeedAudit.grace)
        audit(b)
        XCTAssertEqual(seqs(s), [1], "caught up from the store")
        XCTAssertEqual(b.gateway.metrics.bus.missed.load(ordering: .relaxed), 1)
        busA.reconnect()
        a.publish("u", "next")
        settle()
        XCTAssertEqual(seqs(s), [1, 2], "the next change follows once, with no second catch-up")
        XCTAssertEqual(b.gateway.metrics.bus.catchUps.load(ordering: .relaxed), 0)
    }

    /// A record still on its way when the head was read, and at the next
    /// round, is delivered as it comes within the grace, not read back.
    func testARecordInFlightDuringTheAuditIsNotReadBack() {
        let s = deviceOnB()
        a.publish("u", "in-flight")
        a.settle()  // committed on A; its record waits in B's engine queue
        b.gateway.soleEngine.runMaintenance()
        b.clock.advance(millis: FeedAudit.every)
        b.gateway.soleEngine.runMaintenance()
        XCTAssertEqual(b.gateway.metrics.engineQueued, 1, "still on its way after two rounds")
        settle()
        b.clock.advance(millis: FeedAudit.grace)
        audit(b)
        XCTAssertEqual(seqs(s), [1])
        XCTAssertEqual(b.gateway.metrics.bus.missed.load(ordering: .relaxed), 0)
    }

    /// A record delayed past the grace is read back from the store, and is
    /// not handed on again when it does arrive. With a reader thread, as on
    /// PostgreSQL: the heads and the catch-up are read there.
    func testARecordLaterThanTheGraceIsReadBackOnceAndDroppedWhenItComes() {
        let readable = FailingStore()
        readable.offersReader = true
        store = readable
        let s = deviceOnB()
        busB.pause()
        a.publish("u", "late")
        settle()  // committed on A; its record held on the way to B
        audit(b)
        b.clock.advance(millis: FeedAudit.grace)
        audit(b)
        XCTAssertEqual(seqs(s), [1], "read back while the record is on its way")
        busB.resume()
        settle()
        XCTAssertEqual(seqs(s), [1], "once")
        XCTAssertEqual(b.gateway.metrics.bus.missed.load(ordering: .relaxed), 1)
        a.publish("u", "next")
        settle()
        XCTAssertEqual(seqs(s), [1, 2])
        XCTAssertEqual(b.gateway.metrics.bus.catchUps.load(ordering: .relaxed), 0)
    }

    /// Past one read's 500 users, a round still reads every followed feed
    /// within its spread: 600 users' lost changes all arrive within the
    /// documented bound, the engine's maintenance running every 100 ms.
    func testEveryFollowedFeedIsAuditedWithinTheBound() {
        let users = (0..<600).map { "u\($0)" }
        let sockets = users.map { u in
            let s = b.webSocket()
            b.hello(s, user: u, cursor: 0)
            return s
        }
        settle()
        busA.disconnect()
        for u in users { a.publish(u, "lost") }
        settle()
        var waited: Millis = 0
        while sockets.contains(where: { seqs($0) != [1] }) && waited < 20_000 {
            b.clock.advance(millis: 100)
            waited += 100
            audit(b)
        }
        XCTAssertEqual(sockets.filter { seqs($0) == [1] }.count, 600, "after \(waited) ms")
        XCTAssertLessThanOrEqual(waited, FeedAudit.every + FeedAudit.spread + FeedAudit.grace + FeedAudit.judgeEvery)
        XCTAssertEqual(b.gateway.metrics.bus.missed.load(ordering: .relaxed), 600)
    }

    /// A device deleted through one node closes its connections on the
    /// others with 4003 (SPEC 4), and one re-registered with another
    /// platform sees, on the others too, what that platform may see.
    func testADeviceDeletedOrReRegisteredOnOneNodeActsOnItsConnectionsOnTheOthers() {
        let s = deviceOnB()  // device "d1", platform other
        let tok = a.token("u")
        let put = a.request("PUT", "/v1/me/devices/d1", token: tok, body: ["platform": "ios"])
        settle()
        XCTAssertEqual(put.response?.status, 200)
        a.request("POST", "/v1/apps/\(Harness.app.id)/users/u/notifications",
                  body: ["appNotificationId": "ios-only", "payload": [:], "targetPlatforms": ["ios"]])
        settle()
        XCTAssertEqual(seqs(s), [1], "seen as ios on node B as well")
        let del = a.request("DELETE", "/v1/me/devices/d1", token: tok)
        settle()
        XCTAssertEqual(del.response?.status, 204)
        XCTAssertEqual(s.session.closeRequest?.code, .forbiddenDevice)
    }

    /// Device events lost while this node was off the bus are made up for
    /// at its resubscription, before the catch-up of the changes also lost:
    /// a device deleted elsewhere meanwhile closes with 4003 and is sent
    /// none of them; one re-registered is caught up by its new view.
    func testDeviceEventsLostWithTheBusActAtTheResubscription() {
        let s = deviceOnB()  // device "d1", platform other
        let gone = b.webSocket()
        b.hello(gone, user: "u", device: "d2", cursor: 0)
        settle()
        let tok = a.token("u")
        busB.disconnect()
        let put = a.request("PUT", "/v1/me/devices/d1", token: tok, body: ["platform": "ios"])
        let del = a.request("DELETE", "/v1/me/devices/d2", token: tok)
        a.request("POST", "/v1/apps/\(Harness.app.id)/users/u/notifications",
                  body: ["appNotificationId": "ios-only", "payload": [:], "targetPlatforms": ["ios"]])
        a.publish("u", "for-all")
        settle()
        XCTAssertEqual(put.response?.status, 200)
        XCTAssertEqual(del.response?.status, 204)
        XCTAssertNil(gone.session.closeRequest, "the event was lost with the bus")
        XCTAssertEqual(seqs(s), [])
        busB.reconnect()
        settle()
        XCTAssertEqual(gone.session.closeRequest?.code, .forbiddenDevice)
        XCTAssertEqual(seqs(gone), [], "a deleted device is sent none of the catch-up")
        XCTAssertNil(s.session.closeRequest)
        XCTAssertEqual(seqs(s), [1, 2], "caught up as ios: the ios-only notification too")
    }

    /// Device events that never came over the bus (their node died between
    /// commit and publish) are made up for by the device audit, read on the
    /// reader thread: the deleted device's connection here closes with 4003,
    /// the re-registered one filters by its new platform.
    func testDeviceEventsThatNeverCameOverTheBusActAtTheDeviceAudit() {
        let readable = FailingStore()
        readable.offersReader = true
        store = readable
        let s = deviceOnB()  // device "d1", platform other
        let gone = b.webSocket()
        b.hello(gone, user: "u", device: "d2", cursor: 0)
        settle()
        gone.read()
        let tok = a.token("u")
        busA.disconnect()
        let put = a.request("PUT", "/v1/me/devices/d1", token: tok, body: ["platform": "ios"])
        let del = a.request("DELETE", "/v1/me/devices/d2", token: tok)
        settle()
        XCTAssertEqual(put.response?.status, 200)
        XCTAssertEqual(del.response?.status, 204)
        XCTAssertNil(gone.session.closeRequest, "the event never came")
        busA.reconnect()
        audit(b)
        XCTAssertEqual(gone.session.closeRequest?.code, .forbiddenDevice)
        XCTAssertNil(s.session.closeRequest)
        a.request("POST", "/v1/apps/\(Harness.app.id)/users/u/notifications",
                  body: ["appNotificationId": "android-only", "payload": [:], "targetPlatforms": ["android"]])
        a.request("POST", "/v1/apps/\(Harness.app.id)/users/u/notifications",
                  body: ["appNotificationId": "ios-only", "payload": [:], "targetPlatforms": ["ios"]])
        settle()
        XCTAssertEqual(seqs(s), [2], "filtered as ios: the ios-only notification, not the android-only one")
        XCTAssertEqual(seqs(gone), [])
    }

    /// A device event whose registration this node cannot read at once (the
    /// store away for a moment) is acted on by the next device audit.
    func testADeviceEventReadWhileTheStoreIsAwayActsAtTheNextDeviceAudit() {
        let flaky = FailingStore()
        store = flaky
        let s = deviceOnB()
        audit(b)  // the device audit's first round: the next is 30 s away
        let del = a.request("DELETE", "/v1/me/devices/d1", token: a.token("u"))
        a.settle()  // deleted on A; its event waits in B's engine queue
        XCTAssertEqual(del.response?.status, 204)
        flaky.failDeviceReads = 1
        settle()
        XCTAssertNil(s.session.closeRequest, "the registration was unreadable")
        audit(b)
        XCTAssertNil(s.session.closeRequest, "no device audit due yet")
        b.clock.advance(millis: DeviceAudit.every)
        audit(b)
        XCTAssertEqual(s.session.closeRequest?.code, .forbiddenDevice, "read again by the device audit")
    }
}
