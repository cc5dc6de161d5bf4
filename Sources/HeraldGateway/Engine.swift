import Foundation
import HeraldCore

/// Runs `job` on a service loop's thread. `post` is callable from any
/// thread; the transport wakes the loop (lws_cancel_service) to run it.
public protocol LoopExecutor: AnyObject, Sendable {
    func post(_ job: @escaping @Sendable () -> Void)
}

/// The engine owns the store and the record of which shards follow which
/// user, and runs every store operation on its own thread, in the order
/// submitted.
///
/// Invariants (docs/ARCHITECTURE.md):
/// - Only the engine thread touches `store`, `following` and `presence`.
/// - Commands run in batches inside one store transaction (group commit).
///   Nothing a batch did is visible to anyone until its commit returned:
///   replies and fan-out are effects queued during the batch and run after
///   the commit, in the order they were queued. A failed commit rolls the
///   batch back and answers each of its commands `unavailable`.
/// - A subscription reads its catch-up and registers its follower in the
///   same command, so every change is either in the catch-up (committed
///   before) or delivered live (committed after) — never both, never none.
///   Effects reach a shard through its FIFO inbox, so the catch-up is on the
///   socket before any live change that follows it.
public final class Engine: @unchecked Sendable {
    struct Command {
        let run: @Sendable (Engine) throws -> Void
        let failed: @Sendable (HeraldError) -> Void
        /// Bookkeeping that needs no store: runs in order after the batch,
        /// also when the batch failed.
        var control: (@Sendable (Engine) -> Void)? = nil
    }

    enum Effect {
        case publish(UserKey, ChangeRecord)
        case run(() -> Void)
    }

    public let store: NotificationStore
    public let metrics: Metrics
    let limits: GatewayLimits
    public internal(set) var shards: [Shard] = []

    private let cond = NSCondition()
    private var queue: [Command] = []
    private var stopping = false
    private var thread: Thread?
    private let finished = DispatchSemaphore(value: 0)

    // Engine-thread state.
    private var effects: [Effect] = []
    /// Per user: how many followers each shard has.
    private var following: [UserKey: [Int: Int]] = [:]
    /// Live connections and polls per user and device, for the devices listing.
    var presence: [UserKey: [String: DevicePresence]] = [:]
    /// lastSeenAt updates not yet written to the store.
    var seenDirty: [UserKey: Set<String>] = [:]
    private var nextSweep: Millis = 0
    private var nextPrune: Millis = 0
    private var nextSeenFlush: Millis = 0

    static let maxBatch = 512

    init(store: NotificationStore, limits: GatewayLimits, metrics: Metrics) {
        self.store = store; self.limits = limits; self.metrics = metrics
    }

    func start() {
        let t = Thread { [self] in runLoop() }
        t.name = "herald-engine"
        thread = t
        t.start()
    }

    /// Runs what is queued, flushes the store and stops the thread.
    func stop() {
        cond.lock()
        stopping = true
        cond.signal()
        cond.unlock()
        if thread != nil { finished.wait() }
    }

    /// Queues `run` for the engine thread. `failed` is called instead of the
    /// command's effects when its batch could not be committed.
    func submit(_ run: @escaping @Sendable (Engine) throws -> Void,
                failed: @escaping @Sendable (HeraldError) -> Void) {
        enqueue(Command(run: run, failed: failed), evenWhenStopping: false)
    }

    /// Queues engine-thread bookkeeping (follower and presence counts).
    func control(_ f: @escaping @Sendable (Engine) -> Void) {
        enqueue(Command(run: { e in e.afterCommit { f(e) } }, failed: { _ in }, control: f), evenWhenStopping: true)
    }

    private func enqueue(_ c: Command, evenWhenStopping: Bool) {
        cond.lock()
        let accepted = !stopping || evenWhenStopping
        if accepted {
            queue.append(c)
            if queue.count == 1 { cond.signal() }
        }
        cond.unlock()
        if !accepted { c.failed(HeraldError(.unavailable, "the gateway is shutting down")) }
    }

    // MARK: Effects (engine thread)

    /// Runs `f` after the current batch commits.
    func afterCommit(_ f: @escaping () -> Void) { effects.append(.run(f)) }

    /// Delivers `record` to the user's followers after the batch commits.
    func publish(_ user: UserKey, _ record: ChangeRecord) {
        effects.append(.publish(user, record))
    }

    /// Starts delivering `user`'s changes to `shard` after this batch.
    func follow(_ user: UserKey, shard: Int) {
        following[user, default: [:]][shard, default: 0] += 1
    }

    /// Live followers of `user` on every shard.
    func followers(of user: UserKey) -> Int { following[user]?.values.reduce(0, +) ?? 0 }

    func unfollow(_ user: UserKey, shard: Int) {
        guard var m = following[user], let n = m[shard] else { return }
        m[shard] = n > 1 ? n - 1 : nil
        following[user] = m.isEmpty ? nil : m
    }

    func markSeen(_ user: UserKey, device: String, at: Millis) {
        presence[user, default: [:]][device, default: DevicePresence()].lastSeenAt = at
        seenDirty[user, default: []].insert(device)
    }

    // MARK: The loop

    private func runLoop() {
        while true {
            cond.lock()
            if queue.isEmpty && !stopping { _ = cond.wait(until: Date(timeIntervalSinceNow: 0.1)) }
            let take = min(queue.count, Self.maxBatch)
            let batch = Array(queue.prefix(take))
            queue.removeFirst(take)
            let done = stopping && queue.isEmpty
            cond.unlock()
            if !batch.isEmpty { execute(batch) }
            maintenance(now: WallClock.now(), force: done)
            if done { break }
        }
        finished.signal()
    }

    private func execute(_ batch: [Command]) {
        let t0 = DispatchTime.now().uptimeNanoseconds
        do {
            try store.begin()
            for c in batch { try c.run(self) }
            try store.commit()
        } catch {
            store.rollback()
            effects.removeAll()
            Log.error("store: batch of \(batch.count) rolled back: \(error)")
            let e = HeraldError(.unavailable, "storage is unavailable; nothing was changed")
            for c in batch {
                if let f = c.control { f(self) } else { c.failed(e) }
            }
            return
        }
        metrics.storeLatency.observe(nanos: DispatchTime.now().uptimeNanoseconds - t0)
        runEffects()
    }

    private func runEffects() {
        let list = effects
        effects.removeAll(keepingCapacity: true)
        // Each user's records in commit order, users in order of first change.
        var pending: [(UserKey, [ChangeRecord])] = []
        var slot: [UserKey: Int] = [:]
        let committed = DispatchTime.now().uptimeNanoseconds
        func flush() {
            for (user, records) in pending {
                guard let shardCounts = following[user] else { continue }
                for (i, _) in shardCounts {
                    let shard = shards[i]
                    shard.post { shard.deliver(user, records, committedAt: committed) }
                }
            }
            pending.removeAll()
            slot.removeAll()
        }
        for e in list {
            switch e {
            case .publish(let u, let r):
                if let i = slot[u] {
                    pending[i].1.append(r)
                } else {
                    slot[u] = pending.count
                    pending.append((u, [r]))
                }
            case .run(let f):
                flush()
                f()
            }
        }
        flush()
    }

    /// Expiry sweep, change pruning, registration lapse, lastSeen flush.
    private func maintenance(now: Millis, force: Bool) {
        if now >= nextSweep || force {
            nextSweep = now + 250
            maintain("expiry sweep") { try sweepExpired(now: now) }
        }
        if now >= nextSeenFlush || force {
            nextSeenFlush = now + 30_000
            maintain("lastSeen flush") { try flushSeen() }
        }
        if now >= nextPrune {
            nextPrune = now + 600_000
            maintain("pruning") {
                let pruned = try store.pruneChanges(before: now - limits.changeRetentionSeconds * 1000)
                let lapsed = try store.pruneDevices(lastSeenBefore: now - limits.deviceLapseSeconds * 1000)
                if pruned + lapsed > 0 { Log.info("pruned \(pruned) old changes, \(lapsed) lapsed devices") }
            }
        }
    }

    private func maintain(_ what: String, _ body: () throws -> Void) {
        do {
            try store.begin()
            try body()
            try store.commit()
            runEffects()
        } catch {
            store.rollback()
            effects.removeAll()
            Log.error("store: \(what) failed: \(error)")
        }
    }

    private func sweepExpired(now: Millis) throws(StoreError) {
        while true {
            let due = try store.expiring(until: now, limit: 500)
            for (user, n) in due {
                publish(user, try store.delete(user, n, reason: .expired, at: now))
            }
            if due.count < 500 { return }
        }
    }

    private func flushSeen() throws(StoreError) {
        for (user, ids) in seenDirty {
            for var d in try store.devices(user) where ids.contains(d.deviceId) {
                if let seen = presence[user]?[d.deviceId]?.lastSeenAt, seen > d.lastSeenAt {
                    d.lastSeenAt = seen
                    try store.saveDevice(user, d)
                }
            }
        }
        seenDirty.removeAll()
    }
}

/// What the engine knows of a device's live connections.
struct DevicePresence {
    var websocket = 0
    var sse = 0
    var heldPolls = 0
    var lastPollAt: Millis = 0
    var lastSeenAt: Millis = 0

    /// SPEC section 3: the transport a device listing shows.
    func transport(now: Millis) -> String? {
        if websocket > 0 { return "websocket" }
        if sse > 0 { return "sse" }
        if heldPolls > 0 || (lastPollAt > 0 && now - lastPollAt <= 60_000) { return "poll" }
        return nil
    }
}
