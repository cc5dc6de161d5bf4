import HeraldCore
import HeraldPorts

/// Both ends of the push outbox (SPEC section 10), on the engine thread.
///
/// **Recording.** A change that a registered device with a push handle may
/// see, while that device has no open connection on any node, gets a push
/// row in the same transaction as the change (`record`, called by
/// `Engine.commit` before the commit). One acknowledged change is never left
/// without its push by a crash, and only the node that committed the change
/// records it: one push per change and device in a cluster.
///
/// **Sending.** A row is claimed, held for `claimLease`, by the node that
/// sends it, at most the transport's `capacity` at once: as it is recorded, when there is
/// room (the common case: no second transaction, no second read), or else by
/// `run` (each engine loop turn), which claims due rows in a transaction of
/// their own, PostgreSQL skipping rows another node is claiming, so each push
/// has one sender. A node that dies holding some lets them go when the lease
/// ends (at least once). Once the claim is durable the pushes go to the
/// `PushTransport`, which never blocks the engine; each outcome comes back as
/// a write in a later batch (`finished`). The engine never waits for a push
/// service, and memory holds only what is in flight, whatever the outbox's
/// length.
///
/// It writes through the batch's `FeedTransaction`, and reads who is
/// connected from the registry (here) and the cluster's records (elsewhere).
final class PushDispatch {
    /// Apps' push settings by app id, swapped whole by a reload.
    let settings = Locked<[String: PushSettings]>([:])
    /// Apps' critical groups (SPEC section 12) by app id, swapped whole by a
    /// reload: the engine's one view of them.
    private let criticalGroups = Locked<[String: [String]]>([:])
    /// Set once before the engine starts (`connect`); nil: pushes are recorded, not sent.
    private(set) var transport: PushTransport?
    /// This partition's share of what the transport takes at once.
    private var capacity = 0
    let metrics: PushMetrics
    private let clock: Clock
    private let registry: FollowerRegistry
    private let cluster: ClusterConnections?
    /// The engine whose batches write the services' answers.
    weak var engine: Engine?

    /// Longer than any push may take: 30 s for an FCM access token, then
    /// 30 s for the request, then its answer's write. (A SQLite node
    /// releases its own claims when it starts.)
    static let claimLease: Millis = 120_000
    static let firstRetry: Millis = 1_000
    static let lastRetry: Millis = 300_000
    /// A push with less lifetime left is not sent (`expired`): a TTL that
    /// rounds to 0 means "now or never" to most services, and WNS refuses it.
    static let minLifetime: Millis = 1_000

    static func outlives(_ m: PushMessage, at t: Millis) -> Bool { m.expiresAt - t >= minLifetime }

    /// `app`'s critical groups, as its config in force names them.
    func critical(_ app: String) -> [String] { criticalGroups.withLock { $0[app] ?? [] } }

    /// `user`'s preferences as they apply now: the store's, with the app's critical groups.
    func preferences(_ user: UserKey, in reads: StoreLookups) throws(StoreError) -> Preferences {
        try reads.preferences(user).with(critical: critical(user.app))
    }

    // Engine thread only.
    private var candidates: [(user: UserKey, record: ChangeRecord, group: String?, published: Bool)] = []
    /// Claimed by this node and not yet answered, counting those the open
    /// batch claimed (given back if it rolls back).
    private var inFlight = 0
    private var wake = true
    private var nextPoll: Millis = 0
    private var nextPending: Millis = 0
    /// The earliest time a push this node retried, or a tap it spaced, falls due.
    private var nextRetry: Millis?
    /// This partition's outbox length, as last added to `herald_push_pending`.
    private var countedPending = 0
    /// Each device's last services' answers, for the inspector (nothing in
    /// the store keeps them): 10 a device, for up to 10,000 devices a partition.
    private(set) var outcomes = RecentOutcomes<DeviceKey>(perKey: 10, keys: 10_000)

    init(metrics: PushMetrics, clock: Clock, registry: FollowerRegistry, cluster: ClusterConnections?) {
        self.metrics = metrics; self.clock = clock; self.registry = registry; self.cluster = cluster
    }

    /// Sends through `transport`, sharing its capacity with the other partitions.
    func connect(_ transport: PushTransport?, partitions: Int) {
        self.transport = transport
        capacity = transport.map { max(1, $0.capacity / max(1, partitions)) } ?? 0
    }

    func configure(_ apps: [AppConfig]) {
        let pushing = apps.compactMap { a in a.push.map { (a.id, $0) } }
        settings.withLock { $0 = Dictionary(pushing, uniquingKeysWith: { _, last in last }) }
        criticalGroups.withLock { $0 = Dictionary(apps.map { ($0.id, $0.criticalGroups) }, uniquingKeysWith: { _, last in last }) }
        if !pushing.isEmpty { metrics.enabled.store(true, ordering: .relaxed) }
    }

    // MARK: Recording (inside the batch's transaction)

    /// A change of `user` committing in this batch (`FeedTransaction`), to
    /// a notification of `group`.
    func note(_ user: UserKey, _ record: ChangeRecord, group: String?, published: Bool) {
        guard settings.withLock({ $0.keys.contains(user.app) }) else { return }
        candidates.append((user, record, group, published))
    }

    func rolledBack() { candidates.removeAll() }

    /// Records the pushes this batch's changes give, before its commit.
    func record(_ tx: FeedTransaction) throws(StoreError) {
        guard !candidates.isEmpty else { return }
        defer { candidates.removeAll(keepingCapacity: true) }
        // One read for the batch's users (PostgreSQL: one round trip). Most
        // users of a busy app have no handle: they cost a lookup here and
        // nothing more, which is what keeps push off live delivery's bill.
        var distinct = Set<UserKey>(minimumCapacity: candidates.count)
        let holders = try tx.reads.pushDevices(of: candidates.compactMap { distinct.insert($0.user).inserted ? $0.user : nil })
        guard !holders.isEmpty else { return }
        let all = settings.withLock { $0 }
        let now = clock.now()
        var order: [UserKey] = [], byUser: [UserKey: [(record: ChangeRecord, published: Bool)]] = [:]
        // Preferences as this transaction has them, read once per user with
        // a handle: a group kept from push sends nothing (SPEC section 12).
        var preferences: [UserKey: Preferences] = [:]
        for c in candidates where holders[c.user] != nil {
            if byUser[c.user] == nil {
                order.append(c.user)
                byUser[c.user] = []
                preferences[c.user] = try self.preferences(c.user, in: tx.reads)
            }
            guard preferences[c.user]!.allows(.push, group: c.group) else { continue }
            byUser[c.user]!.append((c.record, c.published))
        }
        var waiting = false, claimed: [OutgoingPush] = []
        for user in order {
            guard let s = all[user.app] else { continue }
            var others: [String: TransportKind]? = nil
            for d in holders[user]! {
                guard let handle = d.push, s.offers(handle.service),
                      try !connected(user, d.deviceId, others: &others) else { continue }
                let viewer = Viewer(userId: user.user, device: d)
                let epoch = viewer.epoch(store: tx.reads.epoch)
                for (r, published) in byUser[user]! {
                    guard let m = PushMessage.plan(r, published: published, viewer: viewer, service: handle.service,
                                                   alert: s.alert, epoch: epoch, now: now) else { continue }
                    guard Self.outlives(m, at: now) else {
                        metrics.count(handle.service, .expired)
                        continue
                    }
                    let room = inFlight + claimed.count < capacity
                    if let job = try tx.enqueuePush(user, deviceId: d.deviceId, m, at: now,
                                                         claimUntil: room ? now + Self.claimLease : nil) {
                        claimed.append(OutgoingPush(job: job, handle: handle, settings: s))
                    } else {
                        waiting = true
                    }
                }
            }
        }
        // Sent, or claimed by `run`, once durable with the change.
        guard let transport else { return }
        if waiting { tx.afterCommit { [self] in wake = true } }
        hand(tx, transport, claimed)
    }

    /// A WebSocket of `deviceId` was lost (no close handshake) soon after
    /// `last` went to it, which may never have arrived (SPEC section 10): a
    /// tap, unless the device is connected again or has no handle to take it.
    func tapAfterLoss(_ tx: FeedTransaction, _ user: UserKey, _ deviceId: String, _ last: LostChange, epoch: String) throws(StoreError) {
        var others: [String: TransportKind]? = nil
        guard let s = settings.withLock({ $0[user.app] }), let d = try tx.reads.device(user, id: deviceId), let handle = d.push,
              handle.service != .webpush, s.offers(handle.service),
              try !connected(user, deviceId, others: &others) else { return }
        let now = clock.now()
        let m = PushMessage(kind: .tap, op: last.deleted ? .delete : .state, cursor: last.seq, epoch: epoch,
                            notificationId: last.notificationId, expiresAt: now + PushMessage.maxLifetime)
        try tx.enqueuePush(user, deviceId: deviceId, m, at: now, claimUntil: nil)
        tx.afterCommit { [self] in wake = true }
    }

    /// SPEC section 10: a WebSocket, an event stream or a held poll, here or
    /// on another node. A poll answered is no connection: a device that
    /// polls gets its pushes (another node shows only "polled lately").
    /// `others`: the user's connections on other nodes, read from the store
    /// once, when a device of the user is first asked about.
    private func connected(_ user: UserKey, _ deviceId: String, others: inout [String: TransportKind]?) throws(StoreError) -> Bool {
        if let c = registry.connections(user, device: deviceId), c.websocket > 0 || c.sse > 0 || c.heldPolls > 0 { return true }
        guard let cluster else { return false }
        if others == nil { others = try cluster.elsewhere(user) }
        guard let t = others?[deviceId] else { return false }
        return t != .poll
    }

    // MARK: Sending

    /// Claims due pushes and hands them to the transport, when something may be due.
    /// `storeWide`: this partition counts the store's whole outbox (`Engine.doesStoreWideWork`).
    func run(_ transactions: Transactions, now: Millis, tick: Millis, storeWide: Bool) {
        guard let transport else { return }
        let room = capacity - inFlight
        let retryDue = nextRetry.map { now >= $0 } ?? false
        guard room > 0, wake || retryDue || tick >= nextPoll else { return }
        wake = false
        nextPoll = tick + Outbox.pollEvery
        if retryDue { nextRetry = nil }
        let countPending = tick >= nextPending && storeWide
        if countPending { nextPending = tick + Outbox.pendingEvery }
        var claimed = 0
        let done = transactions.run("push claim") { tx throws(StoreError) in
            var outgoing: [OutgoingPush] = []
            let jobs = try tx.claimPushes(now: now, until: now + Self.claimLease, limit: room)
            claimed = jobs.count
            if countPending {
                // The gauge sums the partitions' outboxes: each adds how its own moved.
                let pending = try tx.reads.pendingPushes()
                metrics.pending.add(pending - countedPending, ordering: .relaxed)
                countedPending = pending
            }
            guard !jobs.isEmpty else { return }
            let all = settings.withLock { $0 }
            let registrations = try tx.reads.pushDevices(of: Array(Set(jobs.map(\.user))))
            for job in jobs {
                // The handle as registered now: one removed or moved since stops its pushes.
                guard let s = all[job.user.app],
                      let handle = registrations[job.user]?.first(where: { $0.deviceId == job.deviceId })?.push,
                      s.offers(handle.service) else {
                    try tx.finishPush(job)
                    continue
                }
                guard Self.outlives(job.message, at: now) else {
                    try tx.finishPush(job)
                    metrics.count(handle.service, .expired)
                    continue
                }
                outgoing.append(OutgoingPush(job: job, handle: handle, settings: s))
            }
            hand(tx, transport, outgoing)
        }
        // A full claim may have left more due.
        if done && claimed == room { wake = true }
    }

    /// Pushes claimed in the open transaction: counted in flight at once
    /// (given back if it rolls back), sent once it is durable.
    private func hand(_ tx: FeedTransaction, _ transport: PushTransport, _ pushes: [OutgoingPush]) {
        guard !pushes.isEmpty, let engine else { return }
        inFlight += pushes.count
        tx.onRollback { [self] in inFlight -= pushes.count }
        tx.afterCommit { for o in pushes { Self.send(engine, transport, o) } }
    }

    private static func send(_ engine: Engine, _ transport: PushTransport, _ o: OutgoingPush) {
        transport.send(o) { outcome in
            engine.write(users: [o.job.user], taken: { e in e.push.inFlight -= 1 }) { e throws(StoreError) in
                try e.push.finished(e.tx, o, outcome, now: e.clock.now())
            }
        }
    }

    /// What a service's answer does to the outbox and the registration.
    private func finished(_ tx: FeedTransaction, _ o: OutgoingPush, _ outcome: PushOutcome, now: Millis) throws(StoreError) {
        let service = o.handle.service, app = o.job.user.app
        let credentials = PushHealth.Credentials(app, o.handle)
        // A tap recorded while this one was in flight is due now (`PushJob`).
        if o.job.message.kind == .tap { wake = true }
        func note(_ what: String, _ reason: String? = nil) {
            outcomes.note(DeviceKey(user: o.job.user, device: o.job.deviceId), .init(at: now, outcome: what, reason: reason))
        }
        switch outcome {
        case .delivered:
            try tx.finishPush(o.job)
            // The device's next tap waits out the interval, in the store: every node holds to it.
            if o.job.message.kind == .tap, o.settings.tapIntervalSeconds > 0 {
                let until = now + Millis(o.settings.tapIntervalSeconds) * 1_000
                try tx.spaceTaps(o.job.user, deviceId: o.job.deviceId, until: until)
                nextRetry = min(nextRetry ?? until, until)
            }
            metrics.count(service, .delivered)
            note("delivered")
            metrics.latency.observe(nanos: UInt64(max(0, now - o.job.committedAt)) * 1_000_000)
            if metrics.health.accepted(credentials) { Log.info("push: \(service.rawValue) accepts \(credentials.description) again") }
            judge(app, service, deadReason: nil)
        case .unregistered(let why, let reason):
            // The device stays registered, without the dead handle. One
            // registered since (a new token) keeps the device's pushes.
            if let d = try tx.reads.device(o.job.user, id: o.job.deviceId), d.push?.key == o.handle.key {
                try tx.removeHandle(o.job.user, from: d, .dead(service, at: now))
                note("handleRemoved", reason)
            } else {
                try tx.finishPush(o.job)
                note("unregistered", reason)
            }
            metrics.count(service, .unregistered, reason: reason)
            Log.info("push: \(service.rawValue) says the handle of device \(o.job.deviceId) of \(o.job.user) is dead (\(why)); removed")
            judge(app, service, deadReason: reason)
        case .retry(_, let after):
            note("retry")
            try retry(tx, o, afterSeconds: after, now: now)
        case .credentialsRefused(let why):
            if metrics.health.refused(credentials) {
                Log.error("push: \(service.rawValue) refused \(credentials.description) (\(why)); pushes are kept and retried")
            }
            note("credentialsRefused")
            try retry(tx, o, afterSeconds: nil, now: now)
        case .rejected(let why, let reason):
            try tx.finishPush(o.job)
            note("rejected", reason)
            metrics.count(service, .rejected, reason: reason)
            Log.warning("push: \(service.rawValue) refused a push to device \(o.job.deviceId) of \(o.job.user) (\(why)); dropped")
            judge(app, service, deadReason: nil)
        }
    }

    /// Logs, once, that most of an app's recent answers from a service call
    /// handles dead for one reason, and when they no longer do (`DeadHandleWatch`).
    private func judge(_ app: String, _ service: PushService, deadReason: String?) {
        switch metrics.health.answered(app, service, deadReason: deadReason) {
        case .suspect(let reason)?:
            Log.error("push: most of \(service.rawValue)'s recent answers for app \(app) call handles dead (\(reason)):"
                      + " likely a configuration error (docs/OPERATIONS.md, \"Push\"); the handles are being removed")
        case .cleared(let reason)?:
            Log.info("push: \(service.rawValue)'s answers for app \(app) no longer mostly call handles dead (\(reason))")
        case nil: break
        }
    }

    /// Again after 1 s doubling to 5 min, with up to a quarter more at
    /// random (so devices failed together are not retried together), and no
    /// sooner than the service asked; dropped once that leaves less than
    /// `minLifetime` of the push's lifetime.
    private func retry(_ tx: FeedTransaction, _ o: OutgoingPush, afterSeconds: Int?, now: Millis) throws(StoreError) {
        let jittered = Outbox.backoff(attempts: o.job.attempts, first: Self.firstRetry, last: Self.lastRetry, jitter: Outbox.randomJitter)
        let at = now + max(jittered, Millis(afterSeconds ?? 0) * 1_000)
        guard Self.outlives(o.job.message, at: at) else {
            try tx.finishPush(o.job)
            return metrics.count(o.handle.service, .expired)
        }
        try tx.retryPush(o.job, at: at)
        metrics.count(o.handle.service, .retried)
        nextRetry = min(nextRetry ?? at, at)
    }
}

/// The last change a connection was sent, and when (a tick), as a tap
/// after its loss tells it (`PushDispatch.tapAfterLoss`): no payload and
/// no epoch (the subscription has it), so a connection keeps little.
struct LostChange: Sendable {
    let seq: Int64
    let notificationId: String
    let deleted: Bool
    let at: Millis

    /// nil for a save of preferences, which sends no push (SPEC section 12).
    init?(_ r: ChangeRecord, at: Millis) {
        seq = r.seq
        self.at = at
        switch r.change.op {
        case .upsert(let n): notificationId = n.id; deleted = false
        case .delete(let id, _, _): notificationId = id; deleted = true
        case .preferences: return nil
        }
    }
}
