import Foundation
import HeraldCore
import HeraldPorts

/// What a `BatchExecutor` runs its batches in: a transaction it begins,
/// claims locks in, commits or rolls back. The executor knows nothing of
/// what its commands write; the engine's feed transaction does.
protocol BatchTransaction: AnyObject {
    func begin() throws(StoreError)
    /// Takes the locks of `users` (and the users of `lookups`) in the store's one order.
    func claim(_ users: [UserKey], lookups: [NotificationLookup]) throws(StoreError)
    /// Commits, calling `beforeCommit` just before the store's commit;
    /// answers what to run once the commit is durable.
    func commit(beforeCommit: () -> Void) throws(StoreError) -> () -> Void
    /// Undoes the open transaction after `error`.
    func rollback(after error: any Error)
    /// Whether the last commit reached the store (`NotificationStore.lastCommitReachedStore`).
    var lastCommitReachedStore: Bool { get }
}

/// Runs commands on a thread of its own, in the order submitted, in
/// batches inside one store transaction (group commit), and runs each
/// batch's durable work once its commit is durable, batch after batch in
/// commit order. With a store whose commit leaves its sync to `CommitSync`
/// the durable work waits for the sync thread (`CommitSyncer`) while the
/// next batch runs, which meanwhile takes in what arrives (one commit per
/// sync). A batch that failed is rolled back and each of its commands
/// answered `unavailable`; one that lost a conflict with another node (a
/// deadlock) runs again first.
final class BatchExecutor: @unchecked Sendable {  // the queue is under `cond`; the rest is its thread's state, checked
    struct Command {
        /// The users it writes, claimed before the batch runs (see `runBatch`),
        /// and the notifications it will look up, read ahead then.
        var users: [UserKey] = []
        var lookups: [NotificationLookup] = []
        /// Its users are known only once it runs (an app-wide send by tags),
        /// so it claims them itself: it runs in a batch of its own, where
        /// that claim is the only one (see `takeBatch`).
        var alone = false
        let run: @Sendable () throws -> Void
        let failed: @Sendable (HeraldError) -> Void
        /// Bookkeeping that needs no store: runs in order after the batch,
        /// also when the batch failed.
        var control: (@Sendable () -> Void)? = nil
        /// Bookkeeping that runs once, as soon as the executor takes the
        /// command, ahead of its batch.
        var early: (@Sendable () -> Void)? = nil
        /// Bookkeeping only: a batch of such commands asks nothing of the
        /// store, so it says nothing of the store's health.
        var bookkeeping: Bool { control != nil || early != nil }
    }

    static let maxBatch = 512
    /// How many times a batch runs when it keeps losing conflicts with
    /// other nodes' (PostgreSQL deadlocks) before it is answered 503.
    static let conflictAttempts = 3
    /// Unsynced batches past which the executor waits for the disk before
    /// committing more (a stalled sync holds replies, so it holds new work).
    static let maxUnsynced = 4

    let thread: ThreadOwner
    let health: StoreHealth
    /// Syncs commits off this thread, for stores that leave that to `CommitSync`.
    let syncer: CommitSyncer?
    private let metrics: Metrics
    /// Its share of `herald_engine_queue`.
    private let queued: EngineQueue
    private let name: String
    private let target: BatchTransaction

    private let cond = MonotonicCondition()
    private var queue: [Command] = []
    private var stopping = false
    /// The sync thread moved on since the executor last looked.
    private var syncAdvanced = false
    private var runner: Thread?
    private let finished = DispatchSemaphore(value: 0)
    /// Committed batches waiting for their sync, oldest first: their
    /// generation, when they began (nil: maintenance), their durable work.
    private var unsynced: [(generation: UInt64, began: UInt64?, work: () -> Void)] = []

    init(_ target: BatchTransaction, partition: Int, thread: ThreadOwner, syncer: CommitSyncer?, metrics: Metrics, clock: Clock) {
        self.target = target; name = "herald-engine-\(partition)"; self.thread = thread; self.syncer = syncer; self.metrics = metrics
        queued = metrics.engineQueue(partition: partition)
        health = StoreHealth(clock: clock)
    }

    /// Starts the sync thread, if the store syncs apart. (Tests that run
    /// the executor on their own thread may start it alone.)
    func startSyncThread() {
        syncer?.start { [weak self] in self?.wake() }
    }

    /// Wakes the executor's thread to run the durable work of batches just synced.
    private func wake() {
        cond.lock()
        syncAdvanced = true
        cond.signal()
        cond.unlock()
    }

    /// Starts the thread, which also runs `between` after each batch
    /// (periodic work; true: the executor stops) and `atEnd` last.
    /// (Tests instead call `runQueued` on theirs.)
    func start(between: @escaping @Sendable (_ stopping: Bool) -> Void, atEnd: @escaping @Sendable () -> Void) {
        startSyncThread()
        let t = Thread { [self] in
            nameCurrentThread(name)
            runLoop(between: between, atEnd: atEnd)
        }
        runner = t
        t.start()
    }

    /// Runs what is queued, flushes the store and stops the thread.
    func stop() {
        cond.lock()
        stopping = true
        cond.signal()
        cond.unlock()
        if runner != nil { finished.wait() }
    }

    /// Queues `c`; while stopping, only when `evenWhenStopping` (else it is
    /// answered at once: the gateway shuts down).
    func enqueue(_ c: Command, evenWhenStopping: Bool) {
        cond.lock()
        let accepted = !stopping || evenWhenStopping
        if accepted {
            queue.append(c)
            queued.waiting.add(1, ordering: .relaxed)
            if queue.count == 1 { cond.signal() }
        }
        cond.unlock()
        if !accepted { c.failed(HeraldError.shuttingDown) }
    }

    // MARK: The loop

    private func runLoop(between: (Bool) -> Void, atEnd: () -> Void) {
        thread.claim()
        while true {
            cond.lock()
            if queue.isEmpty && !stopping && !syncAdvanced { cond.wait(until: .seconds(fromNow: 0.1)) }
            syncAdvanced = false
            // Stopping, and the next batch takes all that is queued.
            let done = stopping && queue.count <= nextBatchSize()
            cond.unlock()
            runSynced()
            runBatch()
            between(done)
            if done { break }
        }
        atEnd()
        runSynced(all: true)
        syncer?.stop()
        finished.signal()
    }

    /// Runs every queued command on the calling thread, which becomes the
    /// executor's: the tests' way to drive it step by step.
    func runQueued() {
        thread.claim()
        while runBatch() {}
        // Without the sync thread, sync here; with it, take what it synced.
        runSynced(all: syncer?.isThreaded == false)
    }

    /// Takes up to `n` queued commands; the caller holds `cond`. Their
    /// early bookkeeping runs once the lock is left (`taken`).
    private func dequeue(_ n: Int) -> [Command] {
        let batch = Array(queue.prefix(n))
        queue.removeFirst(batch.count)
        queued.waiting.subtract(batch.count, ordering: .relaxed)
        return batch
    }

    /// The next batch: up to `maxBatch` queued commands, but a command that
    /// claims its users itself (`alone`) only with none before it and none
    /// after. Every batch then takes its locks in one claim, in the store's
    /// one order, so batches on two nodes never deadlock (PostgreSQL);
    /// claiming some users and later others could.
    private func takeBatch() -> [Command] {
        cond.withLock { dequeue(nextBatchSize()) }
    }

    /// How many of the queued commands the next batch may take; the caller holds `cond`.
    private func nextBatchSize() -> Int {
        queue.prefix(Self.maxBatch).firstIndex(where: \.alone).map { max($0, 1) } ?? Self.maxBatch
    }

    /// Runs the early bookkeeping of commands just taken: once, whatever
    /// becomes of their batch.
    private func taken(_ commands: [Command]) -> [Command] {
        for c in commands { c.early?() }
        return commands
    }

    /// While the last commit is still syncing, the open transaction takes
    /// in what arrives (up to `room` commands) instead of committing beside
    /// the sync: one commit per sync, the fewest pages written per command.
    /// nil once it is time to commit: the disk is free, the batch is full
    /// (and not too many batches wait for their sync), or the executor stops.
    private func joinWhileSyncing(room: Int) -> [Command]? {
        guard let syncer, syncer.isThreaded else { return nil }
        cond.lock()
        defer { cond.unlock() }
        while !stopping && !syncer.isIdle {
            if room > 0 && !queue.isEmpty { return dequeue(room) }
            if room == 0 && unsynced.count < Self.maxUnsynced { return nil }
            cond.wait()  // a command (enqueue) or a finished sync (wake)
        }
        return nil
    }

    /// Takes up to `maxBatch` queued commands and runs them as one batch.
    @discardableResult private func runBatch() -> Bool {
        var batch = taken(takeBatch())
        if batch.isEmpty { return false }
        let t0 = DispatchTime.now().uptimeNanoseconds
        var attempt = 1
        while true {
            do {
                try target.begin()
                // Every user the batch names, locked up front in the store's
                // one order, so batches on different nodes never deadlock on
                // each other; and the notifications it will look up, read in
                // one go.
                try target.claim(batch.flatMap(\.users), lookups: batch.flatMap(\.lookups))
                for c in batch { try c.run() }
                // Only stores that sync apart join (SQLite: one writer, and
                // its claim takes no locks, so `alone` is moot there).
                while let joined = joinWhileSyncing(room: Self.maxBatch - batch.count) {
                    let more = taken(joined)
                    try target.claim(more.flatMap(\.users), lookups: more.flatMap(\.lookups))
                    batch += more
                    for c in more { try c.run() }
                }
                try commit(began: t0)
                break
            } catch {
                target.rollback(after: error)
                // A deadlock or serialization failure with another node's
                // batch: nothing of it happened (effects and bookkeeping were
                // undone), so the same commands run again from the start.
                if (error as? StoreError)?.conflict == true, attempt < Self.conflictAttempts {
                    attempt += 1
                    metrics.storeConflictRetries.add(1, ordering: .relaxed)
                    continue
                }
                health.failed(.write, "batch of \(batch.count) (rolled back)", error)
                // Earlier batches' replies and deliveries go first.
                runSynced(all: true)
                let answer = (error as? StoreError)?.outcomeUnknown == true ? StoreHealth.outcomeUnknown : StoreHealth.unavailable
                for c in batch {
                    if let f = c.control { f() } else { c.failed(answer) }
                }
                return true
            }
        }
        // A batch that sent the store nothing (bookkeeping, or a reader's
        // failure handed back by `Engine.readAside`) says nothing of its health.
        if target.lastCommitReachedStore && !batch.allSatisfy(\.bookkeeping) { health.succeeded(.write) }
        return true
    }

    /// Runs `body` as its own transaction (maintenance), then its durable
    /// work; whether it committed. Run again, as a batch is, when it loses a
    /// conflict (a head another node moved since this one cached it).
    @discardableResult func transaction(_ what: String, _ body: () throws(StoreError) -> Void) -> Bool {
        thread.preconditionCurrent()
        let t0 = DispatchTime.now().uptimeNanoseconds
        defer { metrics.maintenanceLatency.observe(nanos: DispatchTime.now().uptimeNanoseconds - t0) }
        for attempt in 1...Self.conflictAttempts {
            do {
                try target.begin()
                try body()
                try commit(began: nil)
                if target.lastCommitReachedStore { health.succeeded(.write) }
                return true
            } catch {
                target.rollback(after: error)
                if error.conflict, attempt < Self.conflictAttempts {
                    metrics.storeConflictRetries.add(1, ordering: .relaxed)
                    continue
                }
                health.failed(.write, what, error)
                return false
            }
        }
        return false
    }

    /// Commits the open transaction; its durable work runs once it is
    /// durable. A commit that throws left the transaction for `rollback`.
    private func commit(began: UInt64?) throws(StoreError) {
        var generation: UInt64?
        let work: () -> Void
        do {
            work = try target.commit { generation = syncer?.beginCommit() }
        } catch {
            // Readers that took a snapshot meanwhile wait for this generation.
            if let generation { syncer?.request(generation) }
            throw error
        }
        guard let syncer, let generation else { return durable(began, work) }
        unsynced.append((generation, began, work))
        syncer.request(generation)
    }

    /// Runs the durable work of the batches synced so far, in commit order;
    /// with `all`, first waits until every committed batch is.
    func runSynced(all: Bool = false) {
        guard let syncer, let last = unsynced.last else { return }
        if all { syncer.wait(for: last.generation) }
        let synced = syncer.syncedGeneration
        while let first = unsynced.first, first.generation <= synced {
            unsynced.removeFirst()
            durable(first.began, first.work)
        }
    }

    private func durable(_ began: UInt64?, _ work: () -> Void) {
        if let began { metrics.storeLatency.observe(nanos: DispatchTime.now().uptimeNanoseconds - began) }
        work()
    }
}

extension HeraldError {
    /// Work that came too late to run before the gateway stops: retry elsewhere.
    static let shuttingDown = HeraldError(.unavailable, "the gateway is shutting down")
}
