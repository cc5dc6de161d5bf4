import HeraldCore
import Synchronization

/// Which thread owns some state: the engine's, or one service loop's. The
/// owner claims it when it starts; debug builds then check every access, as
/// swift-nio's `preconditionInEventLoop` does, so a hop that was forgotten
/// fails in the tests instead of racing in production.
public final class ThreadOwner: Sendable {
    private let owner = Atomic<UInt>(0)
    private let name: String

    public init(_ name: String) { self.name = name }

    /// The calling thread owns the state from now on.
    public func claim() { owner.store(currentThreadID(), ordering: .releasing) }

    public var isCurrent: Bool { owner.load(ordering: .acquiring) == currentThreadID() }

    @inline(__always) public func assertCurrent(file: StaticString = #fileID, line: UInt = #line) {
        assert(isCurrent, "\(name) state touched off its thread", file: file, line: line)
    }
}

/// A value that belongs to one shard's loop, carried through a hop to
/// another thread and back (swift-nio's `NIOLoopBound`). Reading it off its
/// loop is a bug, caught in debug builds.
struct LoopBound<Value>: @unchecked Sendable {  // only `value` reads it, and that checks the thread
    private let wrapped: Value
    let owner: ThreadOwner

    init(_ value: Value, owner: ThreadOwner) {
        owner.assertCurrent()
        wrapped = value; self.owner = owner
    }

    var value: Value {
        owner.assertCurrent()
        return wrapped
    }
}
