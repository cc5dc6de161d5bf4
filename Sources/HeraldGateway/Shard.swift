import Dispatch
import HeraldCore

/// Something on a shard that follows one user's feed live: a WebSocket
/// session, an SSE stream, a held poll. Called on its shard's thread only.
protocol FeedFollower: AnyObject {
    var userKey: UserKey { get }
    var deviceId: String? { get }
    /// Changes committed after the follower's catch-up, in seq order.
    func deliver(_ records: [ChangeRecord])
    func viewerChanged(_ viewer: Viewer)
    func deviceDeleted()
    /// The gateway is stopping: end politely.
    func shutdown()
}

/// One service loop's share of the gateway: the followers on its thread
/// and their timers.
///
/// Thread ownership: everything here is touched only on the shard's loop
/// thread, except `post`, which any thread may call. The engine reaches a
/// shard only through `post`.
public final class Shard: @unchecked Sendable {
    public let index: Int
    let engine: Engine
    let executor: LoopExecutor
    private var followers: [UserKey: [ObjectIdentifier: FeedFollower]] = [:]
    private var timers = Heap<TimerEntry>()
    private var timerSerial: UInt64 = 0

    init(index: Int, engine: Engine, executor: LoopExecutor) {
        self.index = index; self.engine = engine; self.executor = executor
    }

    public func post(_ job: @escaping @Sendable () -> Void) { executor.post(job) }

    func add(_ f: FeedFollower) { followers[f.userKey, default: [:]][ObjectIdentifier(f)] = f }

    func remove(_ f: FeedFollower) {
        guard var m = followers[f.userKey] else { return }
        m[ObjectIdentifier(f)] = nil
        followers[f.userKey] = m.isEmpty ? nil : m
    }

    /// `committedAt`: monotonic nanoseconds when the records' batch committed.
    func deliver(_ user: UserKey, _ records: [ChangeRecord], committedAt: UInt64) {
        guard let m = followers[user] else { return }
        for f in m.values { f.deliver(records) }
        engine.metrics.deliveryLatency.observe(nanos: DispatchTime.now().uptimeNanoseconds &- committedAt)
    }

    func viewerChanged(_ user: UserKey, deviceId: String, viewer: Viewer) {
        guard let m = followers[user] else { return }
        for f in m.values where f.deviceId == deviceId { f.viewerChanged(viewer) }
    }

    func deviceDeleted(_ user: UserKey, deviceId: String) {
        guard let m = followers[user] else { return }
        for f in m.values where f.deviceId == deviceId { f.deviceDeleted() }
    }

    /// Gateway shutdown: every follower ends (WebSockets 1001, held polls
    /// answered empty, event streams closed).
    public func shutdownFollowers() {
        for m in followers.values { for f in m.values { f.shutdown() } }
    }

    // MARK: Timers

    struct TimerEntry: Comparable {
        let at: Millis
        let serial: UInt64
        let fire: () -> Void
        static func < (a: Self, b: Self) -> Bool { a.at != b.at ? a.at < b.at : a.serial < b.serial }
        static func == (a: Self, b: Self) -> Bool { a.serial == b.serial }
    }

    /// Runs `fire` on this thread at `at` (checked by `runTimers`). Callers
    /// guard against firing after they closed.
    func schedule(at: Millis, _ fire: @escaping () -> Void) {
        timerSerial += 1
        timers.push(TimerEntry(at: at, serial: timerSerial, fire: fire))
    }

    /// Called by the transport several times a second.
    public func runTimers(now: Millis) {
        while let t = timers.peek, t.at <= now {
            _ = timers.pop()
            t.fire()
        }
    }
}
