import Dispatch
import HeraldCore
import HeraldPorts

/// One service loop's share of the gateway: the subscriptions on its thread
/// and their timers.
///
/// Thread ownership: everything here is touched only on the shard's loop
/// thread (checked through `thread`), except `post`, which any thread may
/// call. The engine reaches a shard only through `post`.
public final class Shard: @unchecked Sendable {  // loop-thread state, checked by `thread`; `post` is the executor's
    public let index: Int
    let gateway: Gateway
    let executor: LoopExecutor
    /// The loop's thread; the transport claims it when the loop starts.
    public let thread: ThreadOwner
    private var subscriptions: [UserKey: Subscribers] = [:]
    /// Timers by tick (`Clock.ticks`), and by wall time (a token's `exp`).
    private var timers = Heap<TimerEntry>()
    private var wallTimers = Heap<TimerEntry>()
    private var timerSerial: UInt64 = 0
    /// Timers cancelled but still in the heap (dropped when due, or all at
    /// once when they are half of it: a closed connection's token timer may
    /// be weeks away).
    private var cancelled = Set<UInt64>()

    init(index: Int, gateway: Gateway, executor: LoopExecutor) {
        self.index = index; self.gateway = gateway; self.executor = executor
        thread = ThreadOwner("loop \(index)")
    }

    public func post(_ job: @escaping @Sendable () -> Void) { executor.post(job) }

    func add(_ s: Subscription) {
        thread.preconditionCurrent()
        subscriptions[s.user] = subscriptions[s.user].map { $0.adding(s) } ?? .one(s)
    }

    func remove(_ s: Subscription) {
        thread.preconditionCurrent()
        guard let m = subscriptions[s.user] else { return }
        subscriptions[s.user] = m.removing(s)
    }

    /// `committedAt`: monotonic nanoseconds when the records' batch committed.
    func deliver(_ user: UserKey, _ records: [ChangeRecord], committedAt: UInt64) {
        thread.preconditionCurrent()
        guard let m = subscriptions[user] else { return }
        m.forEach { $0.deliver(records) }
        gateway.metrics.deliveryLatency.observe(nanos: DispatchTime.now().uptimeNanoseconds &- committedAt)
    }

    /// Changes of `user` may have been missed on their way here: its
    /// subscriptions catch up from the store.
    func recover(_ user: UserKey) {
        thread.preconditionCurrent()
        subscriptions[user]?.forEach { $0.recover() }
    }

    /// The same for every user here that `included` says (one partition's,
    /// after its bus was away).
    func recover(where included: (UserKey) -> Bool) {
        thread.preconditionCurrent()
        for (user, m) in subscriptions where included(user) { m.forEach { $0.recover() } }
    }

    func viewerChanged(_ user: UserKey, deviceId: String, viewer: Viewer) {
        thread.preconditionCurrent()
        subscriptions[user]?.forEach { s in if s.deviceId == deviceId { s.viewerChanged(viewer) } }
    }

    /// The device audit read `viewer` for the device, off the engine: a
    /// connection here with another view has the engine read the
    /// registration again and tell it (`Engine.deviceChanged`), in order
    /// with every other change of that device. The read itself may be older
    /// than what the connection has, so it is never applied as it is.
    func checkViewer(_ user: UserKey, deviceId: String, read viewer: Viewer) {
        thread.preconditionCurrent()
        var differs = false
        subscriptions[user]?.forEach { s in if s.deviceId == deviceId && s.viewer != viewer { differs = true } }
        if differs { gateway.engine(for: user).deviceChanged(user, deviceId: deviceId) }
    }

    func deviceDeleted(_ user: UserKey, deviceId: String) {
        thread.preconditionCurrent()
        subscriptions[user]?.forEach { s in if s.deviceId == deviceId { s.end(.deviceDeleted) } }
    }

    /// After a reload: ends the subscriptions whose token no longer
    /// verifies (WebSockets 4001, held polls 401, event streams closed);
    /// answers how many.
    func endRevoked() -> Int {
        thread.preconditionCurrent()
        let apps = gateway.apps
        var ended = 0
        for m in subscriptions.values {
            m.forEach { s in
                guard !s.tokenHolds(in: apps) else { return }
                s.end(.revoked)
                ended += 1
            }
        }
        return ended
    }

    /// Past `shutdownSubscriptions`: admissions completing now end at once.
    private(set) var isShuttingDown = false

    /// Gateway shutdown: every subscription ends (WebSockets 1001, held
    /// polls answered empty, event streams closed), also those whose
    /// admission is still on its way.
    public func shutdownSubscriptions() {
        thread.preconditionCurrent()
        isShuttingDown = true
        for m in subscriptions.values { m.forEach { $0.end(.shutdown) } }
    }

    // MARK: Timers

    struct TimerEntry: Comparable {
        let at: Millis
        let serial: UInt64
        let fire: () -> Void
        static func < (a: Self, b: Self) -> Bool { a.at != b.at ? a.at < b.at : a.serial < b.serial }
        static func == (a: Self, b: Self) -> Bool { a.serial == b.serial }
    }

    /// Runs `fire` on this thread at tick `at` (`Clock.ticks`, checked by
    /// `runTimers`), unless cancelled first.
    @discardableResult func schedule(at: Millis, _ fire: @escaping () -> Void) -> TimerID {
        let t = timer(at, fire)
        timers.push(t)
        return TimerID(serial: t.serial)
    }

    /// Runs `fire` once the wall clock reads `wall` (a token's `exp`, which
    /// is wall time: a clock set forward expires it sooner), unless cancelled.
    @discardableResult func schedule(atWall wall: Millis, _ fire: @escaping () -> Void) -> TimerID {
        let t = timer(wall, fire)
        wallTimers.push(t)
        return TimerID(serial: t.serial)
    }

    private func timer(_ at: Millis, _ fire: @escaping () -> Void) -> TimerEntry {
        thread.preconditionCurrent()
        timerSerial += 1
        return TimerEntry(at: at, serial: timerSerial, fire: fire)
    }

    func cancel(_ id: TimerID?) {
        thread.preconditionCurrent()
        guard let id, id.serial > 0, id.serial <= timerSerial else { return }
        cancelled.insert(id.serial)
        if cancelled.count > 64, cancelled.count * 2 > timers.count + wallTimers.count {
            timers.removeAll { cancelled.contains($0.serial) }
            wallTimers.removeAll { cancelled.contains($0.serial) }
            cancelled.removeAll()
        }
    }

    /// Serials start at 1: `none` (0) names no timer, so a connection holds
    /// a timer in 8 bytes, not an optional's 16.
    struct TimerID {
        fileprivate let serial: UInt64
        static let none = TimerID(serial: 0)
    }

    var pendingTimers: Int { timers.count + wallTimers.count - cancelled.count }

    /// Fires the timers that are due. The transport calls it several times a
    /// second; tests call it after moving their clock.
    public func runTimers() {
        thread.preconditionCurrent()
        fireDue(\.timers, now: gateway.clock.ticks())
        fireDue(\.wallTimers, now: gateway.clock.now())
    }

    private func fireDue(_ heap: ReferenceWritableKeyPath<Shard, Heap<TimerEntry>>, now: Millis) {
        while let t = self[keyPath: heap].peek, t.at <= now {
            _ = self[keyPath: heap].pop()
            if cancelled.remove(t.serial) == nil { t.fire() }
        }
    }
}

/// A user's subscriptions on one shard. Most users have one there, which
/// then costs no collection (a dictionary per user was ~180 bytes of every
/// idle connection). A value: iterating a copy is safe while the
/// subscriptions it calls remove themselves.
private enum Subscribers {
    case one(Subscription)
    case many([Subscription])

    func forEach(_ body: (Subscription) -> Void) {
        switch self {
        case .one(let s): body(s)
        case .many(let list): for s in list { body(s) }
        }
    }

    func adding(_ s: Subscription) -> Subscribers {
        switch self {
        case .one(let a): a === s ? self : .many([a, s])
        case .many(let list): list.contains { $0 === s } ? self : .many(list + [s])
        }
    }

    /// nil once none is left.
    func removing(_ s: Subscription) -> Subscribers? {
        switch self {
        case .one(let a):
            return a === s ? nil : self
        case .many(var list):
            list.removeAll { $0 === s }
            return list.count > 1 ? .many(list) : list.first.map(Subscribers.one)
        }
    }
}
