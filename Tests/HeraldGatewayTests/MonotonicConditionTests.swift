import HeraldPorts
import XCTest
import Synchronization
@testable import HeraldGateway

final class MonotonicConditionTests: XCTestCase {
    /// A timed wait ends at its deadline (false) or at a signal (true).
    func testAWaitEndsAtItsDeadlineOrASignal() {
        let c = MonotonicCondition()
        let signalled = Atomic<Bool>(false)
        c.lock()
        // Nobody signals: the deadline ends it (a spurious wake-up may come first).
        let deadline = MonotonicCondition.Deadline.seconds(fromNow: 0.01)
        var timedOut = false
        for _ in 0..<1_000 where !timedOut { timedOut = !c.wait(until: deadline) }
        XCTAssertTrue(timedOut)
        Thread {
            c.withLock { signalled.store(true, ordering: .relaxed) }
            c.signal()
        }.start()
        while !signalled.load(ordering: .relaxed) {
            XCTAssertTrue(c.wait(until: .seconds(fromNow: 60)), "woken by the signal, long before the deadline")
        }
        c.unlock()
    }
}
