import Foundation
import HeraldCore
import HeraldPorts

/// One partition's batch executor: runs every store write of its users on
/// its own thread, in the order submitted, in batches inside one store
/// transaction (group commit). The gateway has one engine per partition
/// (`Gateway.partitions`); a user belongs to one of them
/// (`Partition.index`), which alone writes its feed, follows it and
/// fans its changes out.
///
/// Invariants (docs/ARCHITECTURE.md):
/// - Only the engine thread touches `store`, `registry` and the effects
///   (checked through `thread`, in release builds too); of `registry`, the bus's
///   thread reads `followedForBus` alone, behind its lock.
/// - Nothing a batch did is visible to anyone until its commit returned and
///   is durable: replies and fan-out are effects queued during the batch and
///   run after the commit, batch after batch, in one flush (`run(_:)`):
///   one bus write, one post per shard with its deliveries, then its
///   replies. With a store whose commit leaves its sync to `CommitSync`, a
///   batch's effects wait for the sync thread (`CommitSyncer`) while the
///   next batch runs. A failed commit rolls the batch back and answers each
///   of its commands `unavailable`; one that lost a conflict with another
///   node (a deadlock) runs again first.
/// - Changes of one user reach each shard in commit order, through the
///   shard's FIFO inbox.
public final class Engine: @unchecked Sendable {  // the queue is under `cond`; the rest is engine-thread state, checked
    struct Command {
        /// The users it writes, claimed before the batch runs (see `runBatch`),
        /// and the notifications it will look up, read ahead then.
        var users: [UserKey] = []
        var lookups: [NotificationLookup] = []
        /// Its users are known only once it runs (an app-wide send by tags),
        /// so it claims them itself: it runs in a batch of its own, where
        /// that claim is the only one (see `takeBatch`).
        var alone = false
        let run: @Sendable (Engine) throws -> Void
        let failed: @Sendable (HeraldError) -> Void
        /// Bookkeeping that needs no store: runs in order after the batch,
        /// also when the batch failed.
        var control: (@Sendable (Engine) -> Void)? = nil
        /// Bookkeeping that runs once, as soon as the engine takes the
        /// command, ahead of its batch (`release`).
        var early: (@Sendable (Engine) -> Void)? = nil
        /// Bookkeeping only: a batch of such commands asks nothing of the
        /// store, so it says nothing of the store's health.
        var bookkeeping: Bool { control != nil || early != nil }
    }

    enum Effect {
        case deliver(UserKey, ChangeRecord)
        /// A reply to a shard: it goes in that shard's one post of the
        /// flush, after the flush's deliveries.
        case reply(Shard, @Sendable () -> Void)
        case run(() -> Void)
    }

    /// A committed batch's effects, run once it is durable.
    struct Committed {
        let effects: [Effect]
        let published: Int
        /// When the batch began, for the store latency (begin to durable);
        /// nil for maintenance.
        let began: UInt64?
    }

    public let store: NotificationStore
    /// The store's reader thread, if it has one: maintenance reads there
    /// (`readAside`).
    private let reader: ReaderThread?
    /// Carries each committed change to the other nodes, and theirs here.
    let bus: Bus?
    public let metrics: Metrics
    let clock: Clock
    let limits: GatewayLimits
    let thread: ThreadOwner
    public internal(set) var shards: [Shard] = []
    /// This engine's place among the gateway's partitions, and all of them
    /// (itself included), set before the engines start.
    let partition: Int
    var partitions: [Engine] = []

    private let cond = MonotonicCondition()
    private var queue: [Command] = []
    private var stopping = false
    /// The sync thread moved on since the engine last looked.
    private var syncAdvanced = false
    private var runner: Thread?
    private let finished = DispatchSemaphore(value: 0)

    // Engine-thread state.
    private var effects: [Effect] = []
    /// Undoes the open batch's bookkeeping outside the store if it rolls back.
    private var undo: [() -> Void] = []
    /// Users with changes that may have committed unseen (the answer to a
    /// COMMIT was lost): their followers here catch up from the store at the
    /// next commit, before any later change of theirs reaches them.
    private var uncertain: Set<UserKey> = []
    /// The registrations a resubscription had to read back were unreadable:
    /// maintenance tries again (`refreshConnectedDevices`).
    var devicesStale = false
    /// Notifications the open batch published: `herald_publishes_total` once it commits.
    var publishedInBatch = 0
    /// Who follows which user, and which devices are connected.
    let registry: FollowerRegistry
    /// In a cluster: this node's devices as the other nodes see them.
    let cluster: ClusterConnections?
    let maintenance = Maintenance()
    /// Syncs commits off this thread, for stores that leave that to `CommitSync`.
    let syncer: CommitSyncer?
    /// Committed batches waiting for their sync, oldest first, with their generation.
    private var unsynced: [(generation: UInt64, batch: Committed)] = []

    static let maxBatch = 512
    /// How many times a batch runs when it keeps losing conflicts with
    /// other nodes' (PostgreSQL deadlocks) before it is answered 503.
    static let conflictAttempts = 3

    let health: StoreHealth
    /// The push outbox's recording and sending (SPEC section 10).
    let push: PushDispatch

    init(store: NotificationStore, reader: ReaderThread?, bus: Bus?, limits: GatewayLimits, metrics: Metrics, clock: Clock,
         partition: Int = 0) {
        self.store = store; self.reader = reader; self.bus = bus; self.limits = limits; self.metrics = metrics; self.clock = clock
        self.partition = partition
        thread = ThreadOwner("engine \(partition)")
        registry = FollowerRegistry(bus: bus != nil, thread: thread)
        health = StoreHealth(clock: clock)
        push = PushDispatch(metrics: metrics.push)
        if let bus, let directory = store as? ClusterDirectory {
            // A partition records its users' devices as a node of its own:
            // its lease, its records, and its database session to fence.
            cluster = ClusterConnections(node: "\(bus.node)-\(partition)", directory: directory, registry: registry)
        } else {
            cluster = nil
        }
        syncer = store.commitSync.map(CommitSyncer.init)
    }

    /// Starts the sync thread, if the store syncs apart. (Tests that run the
    /// engine on their own thread may start it alone.)
    func startSyncThread() {
        syncer?.start { [weak self] in self?.wake() }
    }

    /// Wakes the engine thread to run the effects of batches just synced.
    private func wake() {
        cond.lock()
        syncAdvanced = true
        cond.signal()
        cond.unlock()
    }

    /// Starts the engine thread. (Tests instead call `runQueued` on theirs.)
    func start() {
        startSyncThread()
        let t = Thread { [self] in
            nameCurrentThread("herald-engine-\(partition)")
            runLoop()
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

    // MARK: Hops onto the engine

    /// Runs `body` on the engine in the next batch, then `reply` on `shard`'s
    /// loop once the batch committed: with `body`'s result, or with
    /// `unavailable` when the batch was rolled back (nothing of it happened).
    /// Effects `body` queued (deliveries, `afterCommit`) reach the shard
    /// before the reply. `users` are those `body` will write, nil when they
    /// are known only once it runs (it then claims them itself), `lookups`
    /// the notifications it will read.
    func perform<T: Sendable>(on shard: Shard, users: [UserKey]?, lookups: [NotificationLookup] = [],
                              _ body: @escaping @Sendable (Engine) throws(StoreError) -> T,
                              reply: @escaping (Result<T, HeraldError>) -> Void) {
        let reply = LoopBound(reply, owner: shard.thread)
        let command = Command(users: users ?? [], lookups: lookups, alone: users == nil, run: { e in
            let value = try body(e)
            e.replyAfterCommit(on: shard) { reply.value(.success(value)) }
        }, failed: { err in shard.post { reply.value(.failure(err)) } })
        enqueue(command, evenWhenStopping: false)
    }

    /// Queues engine-thread bookkeeping (a device seen, changes from the
    /// bus): it runs after the batch it lands in, in order with that batch's
    /// effects, committed or not, and also while the gateway stops.
    func control(_ f: @escaping @Sendable (Engine) -> Void) {
        enqueue(Command(run: { e in e.afterCommit { f(e) } }, failed: { _ in }, control: f), evenWhenStopping: true)
    }

    /// Queues the bookkeeping of a connection that went away. It takes
    /// effect as soon as the engine takes it, before the batch it lands in
    /// runs: a device that reconnects at once is counted against its
    /// user's connection limit without the old connection, even when the
    /// old one's batch still waits for its sync.
    func release(_ f: @escaping @Sendable (Engine) -> Void) {
        enqueue(Command(run: { _ in }, failed: { _ in }, early: f), evenWhenStopping: true)
    }

    /// Queues a write no one waits for (a push's outcome): it runs in the
    /// next batch, and if that rolls back nothing of it happened. `users`
    /// are those it writes, claimed with the batch's (as `perform`'s), so
    /// that it locks none out of the shared order. `taken` runs once, when
    /// the engine takes it, whatever becomes of the batch.
    func write(users: [UserKey], taken: @escaping @Sendable (Engine) -> Void,
               _ body: @escaping @Sendable (Engine) throws(StoreError) -> Void) {
        enqueue(Command(users: users, run: { e in try body(e) }, failed: { _ in }, early: taken), evenWhenStopping: true)
    }

    /// Queues a write for another thread that waits for its result:
    /// `reply` runs once, on the engine thread, with `body`'s result once
    /// its batch committed, or with nil when the batch rolled back; at once
    /// on the caller's, with nil, when the engine is stopping.
    func exchange<T: Sendable>(_ body: @escaping @Sendable (Engine) throws(StoreError) -> T,
                               reply: @escaping @Sendable (T?) -> Void) {
        enqueue(Command(run: { e in
            let value = try body(e)
            e.afterCommit { reply(value) }
        }, failed: { _ in reply(nil) }), evenWhenStopping: false)
    }

    private func enqueue(_ c: Command, evenWhenStopping: Bool) {
        cond.lock()
        let accepted = !stopping || evenWhenStopping
        if accepted {
            queue.append(c)
            metrics.engineQueue.add(1, ordering: .relaxed)
            if queue.count == 1 { cond.signal() }
        }
        cond.unlock()
        if !accepted { c.failed(HeraldError.shuttingDown) }
    }

    // MARK: Effects (engine thread)

    /// Runs `f` after the current batch commits.
    func afterCommit(_ f: @escaping () -> Void) {
        thread.preconditionCurrent()
        effects.append(.run(f))
    }

    /// Runs `f` on `shard`'s loop after the current batch commits, behind
    /// the batch's deliveries to that shard.
    func replyAfterCommit(on shard: Shard, _ f: @escaping @Sendable () -> Void) {
        thread.preconditionCurrent()
        effects.append(.reply(shard, f))
    }

    /// Delivers `record` to the user's followers after the batch commits,
    /// and records the pushes it gives before (`published`: a notification
    /// created or replaced by its app, which may show an alert).
    func deliverAfterCommit(_ user: UserKey, _ record: ChangeRecord, published: Bool = false) {
        thread.preconditionCurrent()
        effects.append(.deliver(user, record))
        push.note(user, record, published: published)
    }

    /// Runs `f` if the current batch rolls back.
    func onRollback(_ f: @escaping () -> Void) {
        thread.preconditionCurrent()
        undo.append(f)
    }

    private func rolledBack(after error: any Error) {
        if (error as? StoreError)?.outcomeUnknown == true {
            for case .deliver(let u, _) in effects { uncertain.insert(u) }
        }
        store.rollback()
        effects.removeAll()
        push.rolledBack()
        publishedInBatch = 0
        for f in undo.reversed() { f() }
        undo.removeAll()
    }

    /// Commits the open transaction; its effects run once it is durable.
    /// A commit that throws left the transaction for `rolledBack`.
    private func commit(began: UInt64?) throws(StoreError) {
        try push.record(self)
        let generation = syncer?.beginCommit()
        do {
            try store.commit()
        } catch {
            // Readers that took a snapshot meanwhile wait for this generation.
            if let generation { syncer?.request(generation) }
            throw error
        }
        undo.removeAll()
        recoverUncertain()
        let batch = Committed(effects: effects, published: publishedInBatch, began: began)
        effects.removeAll(keepingCapacity: true)
        publishedInBatch = 0
        guard let syncer, let generation else { return run(batch) }
        unsynced.append((generation, batch))
        syncer.request(generation)
    }

    /// Runs the effects of the batches synced so far, in commit order; with
    /// `all`, first waits until every committed batch is.
    private func runSynced(all: Bool = false) {
        guard let syncer, let last = unsynced.last else { return }
        if all { syncer.wait(for: last.generation) }
        let synced = syncer.syncedGeneration
        while let first = unsynced.first, first.generation <= synced {
            unsynced.removeFirst()
            run(first.batch)
        }
    }

    // MARK: The loop

    private func runLoop() {
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
            maintenance.run(self, now: clock.now(), tick: clock.ticks(), force: done)
            if done { break }
        }
        cluster?.retire(self)
        runSynced(all: true)
        syncer?.stop()
        finished.signal()
    }

    /// Runs every queued command on the calling thread, which becomes the
    /// engine thread: the tests' way to drive the engine step by step.
    public func runQueued() {
        thread.claim()
        while runBatch() {}
        // Without the sync thread, sync here; with it, take what it synced.
        runSynced(all: syncer?.isThreaded == false)
    }

    /// Runs the expiry sweep, pruning and last-seen flush that are due.
    public func runMaintenance(force: Bool = false) {
        thread.claim()
        maintenance.run(self, now: clock.now(), tick: clock.ticks(), force: force)
    }

    /// Takes up to `n` queued commands; the caller holds `cond`. Their
    /// early bookkeeping runs once the lock is left (`taken`).
    private func dequeue(_ n: Int) -> [Command] {
        let batch = Array(queue.prefix(n))
        queue.removeFirst(batch.count)
        metrics.engineQueue.subtract(batch.count, ordering: .relaxed)
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
        for c in commands { c.early?(self) }
        return commands
    }

    /// Unsynced batches past which the engine waits for the disk before
    /// committing more (a stalled sync holds replies, so it holds new work).
    static let maxUnsynced = 4

    /// While the last commit is still syncing, the open transaction takes
    /// in what arrives (up to `room` commands) instead of committing beside
    /// the sync: one commit per sync, the fewest pages written per command.
    /// nil once it is time to commit: the disk is free, the batch is full
    /// (and not too many batches wait for their sync), or the engine stops.
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
                try store.begin()
                // Every user the batch names, locked up front in the store's
                // one order, so batches on different nodes never deadlock on
                // each other; and the notifications it will look up, read in
                // one go.
                try store.claim(batch.flatMap(\.users), lookups: batch.flatMap(\.lookups))
                for c in batch { try c.run(self) }
                // Only stores that sync apart join (SQLite: one writer, and
                // its claim takes no locks, so `alone` is moot there).
                while let joined = joinWhileSyncing(room: Self.maxBatch - batch.count) {
                    let more = taken(joined)
                    try store.claim(more.flatMap(\.users), lookups: more.flatMap(\.lookups))
                    batch += more
                    for c in more { try c.run(self) }
                }
                try commit(began: t0)
                break
            } catch {
                rolledBack(after: error)
                // A deadlock or serialization failure with another node's
                // batch: nothing of it happened (effects and bookkeeping were
                // undone), so the same commands run again from the start.
                if (error as? StoreError)?.conflict == true, attempt < Self.conflictAttempts {
                    attempt += 1
                    metrics.storeConflictRetries.add(1, ordering: .relaxed)
                    continue
                }
                health.failed("batch of \(batch.count) (rolled back)", error)
                // Earlier batches' replies and deliveries go first.
                runSynced(all: true)
                let answer = (error as? StoreError)?.outcomeUnknown == true ? StoreHealth.outcomeUnknown : StoreHealth.unavailable
                for c in batch {
                    if let f = c.control { f(self) } else { c.failed(answer) }
                }
                return true
            }
        }
        // A batch that sent the store nothing (bookkeeping, or a reader's
        // failure handed back by `readAside`) says nothing of its health.
        if store.lastCommitReachedStore && !batch.allSatisfy(\.bookkeeping) { health.succeeded() }
        return true
    }

    /// Runs `body` on the store's reader thread, then `reply` on this one
    /// (as a `control` command); without a reader thread, both now, here.
    /// For maintenance's routine reads, which would otherwise hold up every
    /// batch queued behind them for a round trip to the database (on a
    /// receiving node, every delivery from the bus; docs/BENCHMARKS.md).
    /// Each value they read stands alone (a head, a registration), so they
    /// need no snapshot (`StoreReader.read`). A success says the store works
    /// unless `vouches` is false (a body that may not reach the store).
    func readAside<T: Sendable>(_ body: @escaping @Sendable (StoreReading) throws(StoreError) -> T, vouches: Bool = true,
                                reply: @escaping @Sendable (Engine, Result<T, StoreError>) -> Void) {
        thread.preconditionCurrent()
        guard let reader else { return reply(self, Result { () throws(StoreError) in try body(store) }) }
        reader.submit { [self] r in
            let result = Result { () throws(StoreError) in try body(r) }
            // Failures are the reply's to report, with what failed.
            if vouches, case .success = result { health.succeeded() }
            control { e in reply(e, result) }
        }
    }

    /// Runs `body` as its own transaction (maintenance), then its effects;
    /// whether it committed. Run again, as a batch is, when it loses a
    /// conflict (a head another node moved since this one cached it).
    @discardableResult func transaction(_ what: String, _ body: () throws(StoreError) -> Void) -> Bool {
        thread.preconditionCurrent()
        let t0 = DispatchTime.now().uptimeNanoseconds
        defer { metrics.maintenanceLatency.observe(nanos: DispatchTime.now().uptimeNanoseconds - t0) }
        for attempt in 1...Self.conflictAttempts {
            do {
                try store.begin()
                try body()
                try commit(began: nil)
                if store.lastCommitReachedStore { health.succeeded() }
                return true
            } catch {
                rolledBack(after: error)
                if error.conflict, attempt < Self.conflictAttempts {
                    metrics.storeConflictRetries.add(1, ordering: .relaxed)
                    continue
                }
                health.failed(what, error)
                return false
            }
        }
        return false
    }

    /// The store commits again: followers of `uncertain` users catch up from
    /// it (`Subscription.recover`). Queued on their shards ahead of this
    /// commit's deliveries, so a change that did commit unseen comes before
    /// any later one, and a change that did not is simply not found.
    private func recoverUncertain() {
        guard !uncertain.isEmpty else { return }
        recoverFollowers(of: uncertain)
        uncertain.removeAll()
    }

    /// Catches the followers here of `users` up from the store
    /// (`Subscription.recover`). `heads`, read before this call, are where
    /// the catch-up's snapshot (taken later) reaches at least: records up to
    /// them that still come over the bus are not handed on again.
    func recoverFollowers(of users: some Sequence<UserKey>, heads: [UserKey: Int64] = [:]) {
        for u in users {
            for shard in registry.shards(following: u).map({ shards[$0] }) { shard.post { shard.recover(u) } }
            if let head = heads[u] { registry.caughtUp(u, through: head) }
        }
    }

    /// Runs a committed, durable batch's effects in one flush: the bus takes
    /// all its records in one write, and each shard one post holding its
    /// deliveries, then its replies. Only a `.run` effect (bookkeeping in
    /// order with the batch) flushes what came before it first.
    private func run(_ batch: Committed) {
        if let began = batch.began { metrics.storeLatency.observe(nanos: DispatchTime.now().uptimeNanoseconds - began) }
        metrics.publishes.add(batch.published, ordering: .relaxed)
        // Each user's records in commit order, users in order of first change.
        var pending: [(UserKey, [ChangeRecord])] = []
        var slot: [UserKey: Int] = [:]
        // The same records in commit order, for the other nodes.
        var toBus: [(UserKey, ChangeRecord)] = []
        var posts = ShardPosts(count: shards.count)
        let committed = DispatchTime.now().uptimeNanoseconds
        func flush() {
            if !toBus.isEmpty { bus?.publish(toBus) }
            toBus.removeAll()
            for (user, records) in pending { fanOut(user, records, committedAt: committed, into: &posts) }
            pending.removeAll()
            slot.removeAll()
            posts.post(to: shards)
        }
        for e in batch.effects {
            switch e {
            case .deliver(let u, let r):
                if bus != nil { toBus.append((u, r)) }
                if let i = slot[u] {
                    pending[i].1.append(r)
                } else {
                    slot[u] = pending.count
                    pending.append((u, [r]))
                }
            case .reply(let shard, let f):
                posts.reply(on: shard.index, f)
            case .run(let f):
                flush()
                f()
            }
        }
        flush()
    }

    /// Queues a user's committed records, in seq order, for each shard that
    /// follows the user: the one way in for every change, this node's (after
    /// its commit) and other nodes' (from the bus). With a bus, changes of a
    /// user come from several nodes: `FollowerRegistry.sequence` drops what
    /// was delivered already and catches the followers up from the store
    /// when something may be missing, before delivering more.
    private func fanOut(_ user: UserKey, _ records: [ChangeRecord], committedAt: UInt64, into posts: inout ShardPosts) {
        let following = registry.shards(following: user)
        guard !following.isEmpty else { return }
        let (fresh, gap) = bus == nil ? (records, false) : registry.sequence(user, records)
        guard !fresh.isEmpty else { return }
        if gap { metrics.bus.catchUps.add(1, ordering: .relaxed) }
        for i in following {
            let shard = shards[i]
            posts.deliver(on: i) {
                if gap { shard.recover(user) }
                shard.deliver(user, fresh, committedAt: committedAt)
            }
        }
    }
}

/// What one flush hands the shards: per shard, its deliveries, then its
/// replies, so a writer's acknowledgement follows the change it
/// acknowledges on the shard that sends it.
struct ShardPosts {
    private var deliveries: [[@Sendable () -> Void]]
    private var replies: [[@Sendable () -> Void]]

    init(count: Int) {
        deliveries = Array(repeating: [], count: count)
        replies = Array(repeating: [], count: count)
    }

    mutating func deliver(on shard: Int, _ job: @escaping @Sendable () -> Void) { deliveries[shard].append(job) }
    mutating func reply(on shard: Int, _ job: @escaping @Sendable () -> Void) { replies[shard].append(job) }

    /// One post per shard with something to do. Shards with deliveries alone
    /// go first, so every delivery is on its way before any reply is.
    mutating func post(to shards: [Shard]) {
        let order = shards.indices.filter { replies[$0].isEmpty } + shards.indices.filter { !replies[$0].isEmpty }
        for i in order where !deliveries[i].isEmpty || !replies[i].isEmpty {
            let jobs = deliveries[i] + replies[i]
            shards[i].post { for job in jobs { job() } }
            deliveries[i].removeAll(keepingCapacity: true)
            replies[i].removeAll(keepingCapacity: true)
        }
    }
}

/// The bus's reports, each for this partition's users (`Gateway.BusRouter`
/// hands them out).
extension Engine {
    func received(_ records: [(UserKey, ChangeRecord)]) {
        let at = DispatchTime.now().uptimeNanoseconds
        control { e in
            var order: [UserKey] = [], byUser: [UserKey: [ChangeRecord]] = [:]
            for (u, r) in records {
                if byUser[u] == nil { order.append(u) }
                byUser[u, default: []].append(r)
            }
            var posts = ShardPosts(count: e.shards.count)
            for u in order {
                e.store.noteCommitted(u, byUser[u]!)
                e.fanOut(u, byUser[u]!, committedAt: at, into: &posts)
            }
            posts.post(to: e.shards)
        }
    }

    func follows(_ user: UserKey) -> Bool { registry.followedForBus?.withLock { $0.contains(user) } ?? false }

    /// Another node deleted or re-registered a device: its connections here
    /// (if any) end with 4003, or take its new view, as on that node.
    func deviceChanged(_ user: UserKey, deviceId: String) {
        control { e in
            let shards = e.registry.shards(following: user).map { e.shards[$0] }
            guard !shards.isEmpty else { return }
            // Unreadable now (the store away): the connections keep what
            // they had until the device audit reads it again (`DeviceAudit`).
            let read: Device?
            do { read = try e.store.device(user, id: deviceId) } catch {
                return e.health.failed("device read", error)
            }
            e.tell(shards, user, deviceId, read)
        }
    }

    /// Every follower may have missed changes while the bus was away: all
    /// catch up from the store. Their feeds' heads, read first (now that
    /// the bus is subscribed), become the last seqs delivered, so neither the
    /// next record nor `FeedAudit` takes what was missed for a gap again.
    /// When they cannot be read, the old last seqs stay: a record missed
    /// meanwhile still shows as a gap (seqs are consecutive).
    /// Device events (`deviceChanged`) missed meanwhile carry no seq: the
    /// devices connected here take their registrations as stored instead,
    /// before the catch-up, which then filters by the new views.
    func subscribed() {
        control { e in
            let heads = (try? e.store.heads(e.registry.followedUsers)) ?? [:]
            for (u, head) in heads { e.registry.caughtUp(u, through: head) }
            e.devicesStale = !e.refreshConnectedDevices()
            for shard in e.shards { shard.post { shard.recover(where: e.owns) } }
        }
    }
}

extension Engine {
    /// This engine's partition of the users.
    var share: Partition { Partition(index: partition, count: max(1, partitions.count)) }

    /// Whether `user` belongs to this partition.
    @Sendable func owns(_ user: UserKey) -> Bool { share.owns(user) }

    /// Whether this engine does what spans its whole store (pruning,
    /// counting the pushes waiting): each engine over a store of its own;
    /// the first alone over a store the partitions share.
    var doesStoreWideWork: Bool { partition == 0 || !store.isShared }

    /// Tells the connections of every device connected here what its
    /// registration is now (closed with 4003 if it is gone); false when the
    /// registrations could not be read (the store away), and they keep
    /// what they had.
    func refreshConnectedDevices() -> Bool {
        let connected = followedDevices
        guard !connected.isEmpty else { return true }
        guard let stored = try? store.devices(of: Array(connected.keys)) else { return false }
        forEach(stored, of: connected) { shards, user, id, device in tell(shards, user, id, device) }
        return true
    }

    /// The devices connected here whose users have followers here.
    var followedDevices: [UserKey: Set<String>] {
        registry.connectedDevices.filter { !registry.shards(following: $0.key).isEmpty }
    }

    /// Each of the `connected` devices still followed here, with the shards
    /// that follow its user and its registration in `stored` (nil: gone).
    func forEach(_ stored: [UserKey: [Device]], of connected: [UserKey: Set<String>],
                 _ body: ([Shard], UserKey, String, Device?) -> Void) {
        for (user, ids) in connected {
            let shards = registry.shards(following: user).map { self.shards[$0] }
            guard !shards.isEmpty else { continue }
            for id in ids { body(shards, user, id, stored[user]?.first { $0.deviceId == id }) }
        }
    }
}

extension HeraldError {
    /// Work that came too late to run before the gateway stops: retry elsewhere.
    static let shuttingDown = HeraldError(.unavailable, "the gateway is shutting down")
}
