import Foundation
import HeraldPorts
import XCTest
import HeraldCore
@testable import HeraldGateway

/// The predicate behind every ownership check (`ThreadOwner.isCurrent`):
/// failing it stops the process (`preconditionCurrent`, release builds
/// too), so it is tested here, on the owner's thread and on others.
final class ThreadOwnerTests: XCTestCase {
    func testOnlyTheClaimingThreadOwns() {
        let owner = ThreadOwner("loop 0")
        XCTAssertFalse(owner.isCurrent, "no thread owns what none claimed")
        owner.claim()
        XCTAssertTrue(owner.isCurrent)
        XCTAssertFalse(onAnotherThread { owner.isCurrent })
        XCTAssertTrue(onAnotherThread {
            owner.claim()
            return owner.isCurrent
        })
        XCTAssertFalse(owner.isCurrent, "a thread that claims it takes it over")
    }

    /// The gateway's owners as the checks see them: the shard's and the
    /// engine's are the threads that run them (here both the test's), the
    /// follower registry checks the engine's, and every other thread is
    /// refused.
    func testTheGatewayChecksItsLoopAndEngineThreads() {
        let h = Harness(partitions: 2)
        h.settle()
        let engines = h.gateway.partitions
        XCTAssertTrue(h.shard.thread.isCurrent)
        XCTAssertTrue(engines.allSatisfy { $0.thread.isCurrent && $0.registry.thread === $0.thread })
        XCTAssertFalse(engines[0].thread === engines[1].thread, "each partition's engine has its own owner")
        let shard = h.shard.thread, engine = engines[0].thread
        XCTAssertFalse(onAnotherThread { shard.isCurrent || engine.isCurrent })
    }

    /// A failed check names the thread that touched the state, as
    /// `nameCurrentThread` named it.
    func testTheCallingThreadsNameIsRead() {
        XCTAssertEqual(onAnotherThread { () -> String in
            nameCurrentThread("herald-loop-7")
            return currentThreadName()
        }, "herald-loop-7")
    }

    /// The check itself, in a process of its own (it stops the one it
    /// fails in): the shard's timers run from another thread end the
    /// process, with a message naming the owner and that thread.
    func testTouchingALoopsStateOffItsThreadStopsTheProcess() throws {
        let name = "HeraldGatewayTests.ThreadOwnerTests/testTouchingALoopsStateOffItsThreadStopsTheProcess"
        if ProcessInfo.processInfo.environment["HERALD_TOUCH_OFF_THREAD"] != nil {
            let h = Harness(), shard = h.shard
            _ = onAnotherThread { () -> Bool in
                nameCurrentThread("herald-engine-1")
                shard.runTimers()
                return true
            }
            return XCTFail("the shard's state was touched off its thread unchecked")
        }
        let child = Process()
        child.executableURL = URL(fileURLWithPath: CommandLine.arguments[0])
        child.arguments = [name]
        // No crash report: the stop is the expected outcome.
        child.environment = ProcessInfo.processInfo.environment.merging(["HERALD_TOUCH_OFF_THREAD": "1", "SWIFT_BACKTRACE": "enable=no"]) { $1 }
        let stderr = Pipe()
        child.standardError = stderr
        child.standardOutput = FileHandle.nullDevice
        try child.run()
        let said = String(decoding: stderr.fileHandleForReading.readDataToEndOfFile(), as: UTF8.self)
        child.waitUntilExit()
        XCTAssertEqual(child.terminationReason, .uncaughtSignal, said)
        XCTAssertTrue(said.contains("loop 0 state touched on thread herald-engine-1 (0x"), said)
    }

    private func onAnotherThread<T: Sendable>(_ body: @escaping @Sendable () -> T) -> T {
        let result = Locked<T?>(nil)
        let done = DispatchSemaphore(value: 0)
        Thread {
            let value = body()
            result.withLock { $0 = value }
            done.signal()
        }.start()
        done.wait()
        return result.withLock { $0! }
    }
}
