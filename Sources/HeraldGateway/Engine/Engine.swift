import Foundation
import HeraldCore
import HeraldPorts

/// One partition of the users: the only writer of their feeds, the owner
/// of who follows them here, and the one way their committed changes fan
/// out. The gateway has one engine per partition (`Gateway.partitions`); a
/// user belongs to one of them (`Partition.index`).
///
/// Invariants (docs/ARCHITECTURE.md):
/// - Every write runs on the engine's `BatchExecutor` thread, in a batch,
///   through the batch's `FeedTransaction`, which records each write's
///   effects. Only that thread touches the store, `registry` and the
///   effects (checked through `thread`, in release builds too); of
///   `registry`, the bus's thread reads `followedForBus` alone, behind its lock.
/// - Nothing a batch did is visible to anyone until its commit returned and
///   is durable: its effects then run, batch after batch, in one flush
///   (`run(_:)`): one bus write, one post per shard with its deliveries,
///   then its replies.
/// - Changes of one user reach each shard in commit order, through the
///   shard's FIFO inbox.
public final class Engine: @unchecked Sendable {  // engine-thread state, checked; the executor's queue is its own
    typealias Command = BatchExecutor.Command
    typealias Committed = FeedTransaction.Committed

    /// The store, whose writes go through `tx` alone.
    private let store: NotificationStore
    /// The open batch's writes and their effects.
    let tx: FeedTransaction
    /// Runs the batches, on the engine thread.
    let executor: BatchExecutor
    /// What runs in a batch may read.
    var reads: StoreLookups { store }
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

    /// The registrations a resubscription had to read back were unreadable:
    /// maintenance tries again (`refreshConnectedDevices`).
    var devicesStale = false
    /// Who follows which user, and which devices are connected.
    let registry: FollowerRegistry
    /// In a cluster: this node's devices as the other nodes see them.
    let cluster: ClusterConnections?
    let maintenance = Maintenance()
    /// The push outbox's recording and sending (SPEC section 10).
    let push: PushDispatch
    /// The webhook outbox's recording and sending (SPEC section 13).
    let webhooks: WebhookDispatch

    var health: StoreHealth { executor.health }
    var syncer: CommitSyncer? { executor.syncer }

    init(store: NotificationStore, reader: ReaderThread?, bus: Bus?, limits: GatewayLimits, metrics: Metrics, clock: Clock,
         partition: Int = 0, webhookSenders: WebhookSenders = WebhookSenders()) {
        self.store = store; self.reader = reader; self.bus = bus; self.limits = limits; self.metrics = metrics; self.clock = clock
        self.partition = partition
        thread = ThreadOwner("engine \(partition)")
        registry = FollowerRegistry(bus: bus != nil, thread: thread)
        if let bus, let directory = store as? ClusterDirectory {
            // A partition records its users' devices as a node of its own:
            // its lease, its records, and its database session to fence.
            cluster = ClusterConnections(node: ClusterConnections.node(bus.node, partition: partition), directory: directory, registry: registry)
        } else {
            cluster = nil
        }
        push = PushDispatch(metrics: metrics.push, clock: clock, registry: registry, cluster: cluster)
        webhooks = WebhookDispatch(metrics: metrics.webhooks, senders: webhookSenders, clock: clock, thread: thread)
        tx = FeedTransaction(store: store, thread: thread, push: push, webhooks: webhooks, registry: registry)
        executor = BatchExecutor(tx, partition: partition, thread: thread,
                                 syncer: store.commitSync.map(CommitSyncer.init), metrics: metrics, clock: clock)
        push.engine = self
        webhooks.engine = self
        tx.durable = { [unowned self] in run($0) }
        tx.listed = { [unowned self] user, d, now throws(StoreError) in try listed(user, d, now: now) }
    }

    /// Starts the sync thread, if the store syncs apart. (Tests that run the
    /// engine on their own thread may start it alone.)
    func startSyncThread() { executor.startSyncThread() }

    /// Starts the engine thread, with maintenance between batches. (Tests
    /// instead call `runQueued` on theirs.)
    func start() {
        executor.start(between: { [unowned self] stopping in
            maintenance.run(self, now: clock.now(), tick: clock.ticks(), force: stopping)
        }, atEnd: { [unowned self] in cluster?.retire(transactions) })
    }

    /// Runs what is queued, flushes the store and stops the thread.
    func stop() { executor.stop() }

    /// Runs every queued command on the calling thread, which becomes the
    /// engine thread: the tests' way to drive the engine step by step.
    public func runQueued() { executor.runQueued() }

    /// Runs the expiry sweep, pruning and last-seen flush that are due.
    public func runMaintenance(force: Bool = false) {
        thread.claim()
        maintenance.run(self, now: clock.now(), tick: clock.ticks(), force: force)
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
        let command = Command(users: users ?? [], lookups: lookups, alone: users == nil, run: { [self] in
            let value = try body(self)
            tx.reply(on: shard) { reply.value(.success(value)) }
        }, failed: { err in shard.post { reply.value(.failure(err)) } })
        executor.enqueue(command, evenWhenStopping: false)
    }

    /// Queues engine-thread bookkeeping (a device seen, changes from the
    /// bus): it runs after the batch it lands in, in order with that batch's
    /// effects, committed or not, and also while the gateway stops.
    func control(_ f: @escaping @Sendable (Engine) -> Void) {
        executor.enqueue(Command(run: { [self] in tx.afterCommit { f(self) } }, failed: { _ in }, control: { [self] in f(self) }),
                         evenWhenStopping: true)
    }

    /// Queues the bookkeeping of a connection that went away. It takes
    /// effect as soon as the engine takes it, before the batch it lands in
    /// runs: a device that reconnects at once is counted against its
    /// user's connection limit without the old connection, even when the
    /// old one's batch still waits for its sync.
    func release(_ f: @escaping @Sendable (Engine) -> Void) {
        executor.enqueue(Command(run: {}, failed: { _ in }, early: { [self] in f(self) }), evenWhenStopping: true)
    }

    /// Queues a write no one waits for (a push's outcome): it runs in the
    /// next batch, and if that rolls back nothing of it happened. `users`
    /// are those it writes, claimed with the batch's (as `perform`'s), so
    /// that it locks none out of the shared order. `taken` runs once, when
    /// the engine takes it, whatever becomes of the batch.
    func write(users: [UserKey], taken: @escaping @Sendable (Engine) -> Void,
               _ body: @escaping @Sendable (Engine) throws(StoreError) -> Void) {
        executor.enqueue(Command(users: users, run: { [self] in try body(self) }, failed: { _ in }, early: { [self] in taken(self) }),
                         evenWhenStopping: true)
    }

    /// Queues a write for another thread that waits for its result:
    /// `reply` runs once, on the engine thread, with `body`'s result once
    /// its batch committed, or with nil when the batch rolled back; at once
    /// on the caller's, with nil, when the engine is stopping.
    func exchange<T: Sendable>(_ body: @escaping @Sendable (Engine) throws(StoreError) -> T,
                               reply: @escaping @Sendable (T?) -> Void) {
        executor.enqueue(Command(run: { [self] in
            let value = try body(self)
            tx.afterCommit { reply(value) }
        }, failed: { _ in reply(nil) }), evenWhenStopping: false)
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
            if vouches, case .success = result { health.succeeded(.read) }
            control { e in reply(e, result) }
        }
    }

    /// Runs a transaction of its own (maintenance), then its effects.
    var transactions: Transactions { Transactions(executor: executor, tx: tx) }

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
        metrics.publishes.add(batch.published, ordering: .relaxed)
        // Changes that may have committed unseen come before this batch's.
        if !batch.uncertain.isEmpty { recoverFollowers(of: batch.uncertain) }
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
            case .device(let user, let deviceId, let device):
                // Behind the deliveries before it, as every effect in order.
                flush()
                tell(shards, user, deviceId, device)
                bus?.publish(device: deviceId, of: user)
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
                return e.health.failed(.read, "device read", error)
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
    var doesStoreWideWork: Bool { partition == 0 || !storeIsShared }

    /// Whether the partitions share one store (`NotificationStore.isShared`).
    var storeIsShared: Bool { store.isShared }

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
