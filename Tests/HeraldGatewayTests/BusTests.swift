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
}
