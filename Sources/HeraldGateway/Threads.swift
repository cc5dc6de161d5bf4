import HeraldCore

/// A value that belongs to one shard's loop, carried through a hop to
/// another thread and back (swift-nio's `NIOLoopBound`). Reading it off its
/// loop stops the process (`ThreadOwner.preconditionCurrent`).
struct LoopBound<Value>: @unchecked Sendable {  // only `value` reads it, and that checks the thread
    private let wrapped: Value
    let owner: ThreadOwner

    init(_ value: Value, owner: ThreadOwner) {
        owner.preconditionCurrent()
        wrapped = value; self.owner = owner
    }

    var value: Value {
        owner.preconditionCurrent()
        return wrapped
    }
}
