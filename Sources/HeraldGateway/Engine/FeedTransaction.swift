import HeraldCore

/// The open batch's writes, and what each leaves to do once the batch is
/// durable. The gateway's only way to the store's write methods: a write
/// that changes a feed or a registration records its own effects here, as
/// data (a change to deliver and to offer the bus, its push candidate, a
/// publish counted, a registration's news for its connections), so no write
/// site can forget one. The engine's `BatchExecutor` begins and commits
/// it; once durable, the engine runs what it recorded in one flush
/// (`Engine.run`); a rollback drops it all. Engine thread only.
final class FeedTransaction: BatchTransaction {
    enum Effect {
        /// A committed change: for this node's followers and the bus.
        case deliver(UserKey, ChangeRecord)
        /// A registration changed its view, or was deleted (nil): its
        /// connections here take it, and the other nodes' through the bus.
        case device(UserKey, deviceId: String, Device?)
        /// A reply to a shard: it goes in that shard's one post of the
        /// flush, after the flush's deliveries.
        case reply(Shard, @Sendable () -> Void)
        /// Bookkeeping in order with the batch's effects.
        case run(() -> Void)
    }

    /// What a committed batch leaves to run once it is durable.
    struct Committed {
        let effects: [Effect]
        let published: Int
        /// Users whose changes may have committed unseen before (a COMMIT
        /// whose answer was lost): their followers catch up from the store
        /// before this batch's changes reach them.
        let uncertain: Set<UserKey>
    }

    private let store: NotificationStore
    private let thread: ThreadOwner
    private let push: PushDispatch
    private let webhooks: WebhookDispatch
    private let registry: FollowerRegistry
    private var effects: [Effect] = []
    /// Undoes bookkeeping outside the store if the transaction rolls back.
    private var undo: [() -> Void] = []
    /// Notifications published by their app: `herald_publishes_total` once committed.
    private var published = 0
    private var uncertain: Set<UserKey> = []
    /// Runs a committed transaction's effects once it is durable; set once
    /// by the engine.
    var durable: ((Committed) -> Void)!
    /// A registration as the devices listing shows it (`Engine.listed`);
    /// set once by the engine.
    var listed: ((UserKey, Device, Millis) throws(StoreError) -> JSON)!

    init(store: NotificationStore, thread: ThreadOwner, push: PushDispatch, webhooks: WebhookDispatch, registry: FollowerRegistry) {
        self.store = store; self.thread = thread; self.push = push; self.webhooks = webhooks; self.registry = registry
    }

    /// What the transaction's code may read.
    var reads: StoreLookups { store }

    // MARK: Writes that change feeds

    /// Saves `n` with a new change; `published`: by its app (a publish,
    /// which may show an alert, and counts as one); `actor`: who made it,
    /// which its webhook events name (`.wake`: a snooze ended).
    func upsert(_ user: UserKey, _ n: Notification, previous: Notification?, at now: Millis,
                published: Bool = false, by actor: ChangeActor) throws(StoreError) -> ChangeRecord {
        let r = try store.upsert(user, n, previous: previous, at: now)
        changed(user, r, previous: previous, group: n.groupName, published: published, by: actor)
        if published { self.published += 1 }
        return r
    }

    func delete(_ user: UserKey, _ n: Notification, reason: DeleteReason, at now: Millis, by actor: ChangeActor) throws(StoreError) -> ChangeRecord {
        let r = try store.delete(user, n, reason: reason, at: now)
        changed(user, r, previous: n, group: n.groupName, published: false, by: actor)
        return r
    }

    /// Ends `n`'s snooze (SPEC section 11): it comes back as new, and a
    /// device that is not connected gets the push a new one gets; its
    /// webhook event is `notification.woke` alone.
    func wake(_ user: UserKey, _ n: Notification, at now: Millis) throws(StoreError) -> ChangeRecord {
        let r = try store.upsert(user, n.woken(at: now), previous: n, at: now)
        changed(user, r, previous: n, group: n.groupName, published: true, by: .wake)
        return r
    }

    /// Saves `p` as `user`'s preferences with a new change, which every
    /// device of the user receives, and its `preferences.updated` event; a
    /// save sends no push (SPEC sections 12 and 13).
    func savePreferences(_ user: UserKey, _ p: Preferences, at now: Millis, by actor: ChangeActor) throws(StoreError) -> ChangeRecord {
        thread.preconditionCurrent()
        let r = try store.savePreferences(user, p, at: now)
        effects.append(.deliver(user, r))
        webhooks.note(user, r, previous: nil, published: false, by: actor)
        return r
    }

    /// `previous`: the notification before (nil for a new one); `group`:
    /// whose push preferences apply; `published`: pushed as a new
    /// notification is (an alert where the app configures one); `actor`:
    /// who made it, which its webhook events name.
    private func changed(_ user: UserKey, _ r: ChangeRecord, previous: Notification?, group: String?, published: Bool,
                         by actor: ChangeActor) {
        thread.preconditionCurrent()
        effects.append(.deliver(user, r))
        push.note(user, r, group: group, published: published)
        webhooks.note(user, r, previous: previous, published: published, by: actor)
    }

    /// Notifications whose `deadline` fell, locked for this transaction's writes.
    func due(_ deadline: Deadline, until: Millis, limit: Int, in partition: Partition) throws(StoreError) -> [(UserKey, Notification)] {
        try store.due(deadline, until: until, limit: limit, in: partition)
    }

    func pruneChanges(before: Millis, limit: Int) throws(StoreError) -> Pruned {
        try store.pruneChanges(before: before, limit: limit)
    }

    // MARK: Writes that change registrations

    /// Saves `device`, registered before as `was`: a changed platform or
    /// tag set (its view generation) reaches its open connections.
    func saveDevice(_ user: UserKey, _ device: Device, was: Device?) throws(StoreError) {
        try store.saveDevice(user, device)
        if let was, was.viewGeneration != device.viewGeneration {
            effects.append(.device(user, deviceId: device.deviceId, device))
        }
    }

    /// Why a registration loses its push handle.
    enum HandleRemoval {
        /// Another registration of the app took it.
        case moved
        /// `service` called it dead at `at`: the app's `push.unregistered`
        /// webhook event (SPEC section 13).
        case dead(PushService, at: Millis)
    }

    /// Takes `device`'s push handle from it, with the pushes waiting for
    /// it; the device stays registered. A dead handle's event carries the
    /// device as the listing shows it now.
    func removeHandle(_ user: UserKey, from device: Device, _ why: HandleRemoval) throws(StoreError) {
        var d = device
        d.push = nil
        try saveDevice(user, d, was: device)
        try store.dropPushes(user, deviceId: device.deviceId)
        if case .dead(let service, let now) = why {
            webhooks.note(user.app, .pushUnregistered(user, device: try listed(user, d, now), service: service, at: now))
        }
    }

    /// Deletes a registration; its open connections close with 4003.
    func deleteDevice(_ user: UserKey, id: String) throws(StoreError) -> Bool {
        guard try store.deleteDevice(user, id: id) else { return false }
        effects.append(.device(user, deviceId: id, nil))
        return true
    }

    func pruneDevices(lastSeenBefore before: Millis) throws(StoreError) -> Int {
        try store.pruneDevices(lastSeenBefore: before)
    }

    // MARK: The push and webhook outboxes and shared tokens (NotificationStore's documentation)

    @discardableResult
    func enqueuePush(_ user: UserKey, deviceId: String, _ message: PushMessage, at: Millis,
                     claimUntil: Millis?) throws(StoreError) -> PushJob? {
        try store.enqueuePush(user, deviceId: deviceId, message, at: at, claimUntil: claimUntil)
    }
    func claimPushes(now: Millis, until: Millis, limit: Int) throws(StoreError) -> [PushJob] {
        try store.claimPushes(now: now, until: until, limit: limit)
    }
    func finishPush(_ job: PushJob) throws(StoreError) { try store.finishPush(job) }
    func retryPush(_ job: PushJob, at: Millis) throws(StoreError) { try store.retryPush(job, at: at) }
    func spaceTaps(_ user: UserKey, deviceId: String, until: Millis) throws(StoreError) {
        try store.spaceTaps(user, deviceId: deviceId, until: until)
    }
    func dropPushes(_ user: UserKey, deviceId: String) throws(StoreError) { try store.dropPushes(user, deviceId: deviceId) }
    /// The webhook outbox's writes, which have no effects to record.
    var webhookOutbox: WebhookOutbox { store }
    func replaceSharedToken(_ name: String, with token: SharedToken, replacing: Millis?) throws(StoreError) -> Bool {
        try store.replaceSharedToken(name, with: token, replacing: replacing)
    }

    // MARK: Locks

    /// Locks users found while the transaction runs (an app-wide send by
    /// tags, in a batch of its own), in the store's one order.
    func claim(_ users: [UserKey], lookups: [NotificationLookup] = []) throws(StoreError) {
        try store.claim(users, lookups: lookups)
    }

    // MARK: Follows

    /// Admits a follower, provisionally until the transaction commits
    /// (`FollowerRegistry.admit`): a rollback takes it back.
    func admit(_ follow: Follow, head: Int64?, now: Millis) -> Follow {
        thread.preconditionCurrent()
        return registry.admit(follow, head: head, now: now)
    }

    // MARK: Effects that are not writes

    /// Runs `f` once the transaction is durable, in order with its other effects.
    func afterCommit(_ f: @escaping () -> Void) {
        thread.preconditionCurrent()
        effects.append(.run(f))
    }

    /// Runs `f` on `shard`'s loop once the transaction is durable, behind
    /// its deliveries to that shard.
    func reply(on shard: Shard, _ f: @escaping @Sendable () -> Void) {
        thread.preconditionCurrent()
        effects.append(.reply(shard, f))
    }

    /// Runs `f` if the transaction rolls back.
    func onRollback(_ f: @escaping () -> Void) {
        thread.preconditionCurrent()
        undo.append(f)
    }

    // MARK: Commit and rollback (the engine's)

    func begin() throws(StoreError) { try store.begin() }

    /// Records the pushes the transaction's changes give, then commits;
    /// answers its effects' run once durable. A commit that throws leaves
    /// the transaction for `rollback`.
    func commit(beforeCommit: () -> Void) throws(StoreError) -> () -> Void {
        try push.record(self)
        try webhooks.record(self)
        beforeCommit()
        try store.commit()
        registry.settle()
        undo.removeAll()
        let committed = Committed(effects: effects, published: published, uncertain: uncertain)
        effects.removeAll(keepingCapacity: true)
        published = 0
        uncertain.removeAll()
        return { [durable] in durable!(committed) }
    }

    /// Undoes the transaction. The users whose changes it wrote are
    /// uncertain when the store cannot tell whether it committed (a COMMIT
    /// whose answer was lost).
    func rollback(after error: any Error) {
        if (error as? StoreError)?.outcomeUnknown == true {
            for case .deliver(let u, _) in effects { uncertain.insert(u) }
        }
        store.rollback()
        effects.removeAll()
        push.rolledBack()
        webhooks.rolledBack()
        published = 0
        registry.revert()
        for f in undo.reversed() { f() }
        undo.removeAll()
    }

    /// Whether the last commit reached the store (`NotificationStore.lastCommitReachedStore`).
    var lastCommitReachedStore: Bool { store.lastCommitReachedStore }
}

/// Runs a transaction of its own on the engine thread (periodic work:
/// presence, push claims, maintenance): the executor's, through the feed
/// transaction, so its effects run as a batch's do.
struct Transactions {
    let executor: BatchExecutor
    let tx: FeedTransaction

    /// Whether it committed (`BatchExecutor.transaction`).
    @discardableResult func run(_ what: String, _ body: (FeedTransaction) throws(StoreError) -> Void) -> Bool {
        executor.transaction(what) { () throws(StoreError) in try body(tx) }
    }
}
