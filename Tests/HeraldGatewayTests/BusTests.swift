import XCTest
import HeraldCore
import HeraldStores
@testable import HeraldGateway

/// Two nodes in-process on one store and a `MemoryBus`: changes cross over
/// through the engine's one fan-out, and a lost bus message or a lost bus
/// is caught up from the store, on the same connection, in order, once.
final class BusTests: XCTestCase {
    let store = MemoryStore()
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
    }

    /// Runs `node`'s maintenance, feed audit included, and what it queued.
    func audit(_ node: Harness) {
        node.gateway.engine.runMaintenance()
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
        b.gateway.engine.runMaintenance()
        b.clock.advance(millis: FeedAudit.every)
        b.gateway.engine.runMaintenance()
        XCTAssertEqual(b.gateway.metrics.engineQueue.load(ordering: .relaxed), 1, "still on its way after two rounds")
        settle()
        b.clock.advance(millis: FeedAudit.grace)
        audit(b)
        XCTAssertEqual(seqs(s), [1])
        XCTAssertEqual(b.gateway.metrics.bus.missed.load(ordering: .relaxed), 0)
    }
}
