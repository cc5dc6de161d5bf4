/// Where a user's feed stands. A cursor is usable when
/// `floor <= cursor <= head`: changes after `floor` are all still kept.
public struct FeedState: Sendable, Equatable {
    /// The last seq assigned (0 for a feed with no changes yet).
    public var head: Int64
    /// The highest seq whose change was pruned (0 when nothing was).
    public var floor: Int64
    public init(head: Int64 = 0, floor: Int64 = 0) { self.head = head; self.floor = floor }

    public func accepts(cursor: Int64) -> Bool { cursor >= floor && cursor <= head }
}

/// The position of a notification in history order: newest `createdAt`
/// first, ties broken by the higher `id` (byte order) first.
public struct HistoryKey: Sendable, Equatable, Comparable {
    public let createdAt: Millis
    public let id: String
    public init(createdAt: Millis, id: String) { self.createdAt = createdAt; self.id = id }
    public init(_ n: Notification) { self.init(createdAt: n.createdAt, id: n.id) }

    /// `a < b` when `a` comes first in history (is newer).
    public static func < (a: HistoryKey, b: HistoryKey) -> Bool {
        if a.createdAt != b.createdAt { return a.createdAt > b.createdAt }
        // Ids are ASCII (server-generated), where String order is byte order.
        return a.id > b.id
    }
}

/// How many live notifications with one targeting a user has. Stores keep
/// these up to date with every write, so counting costs in proportion to the
/// distinct targetings of a user, not to the history.
public struct TargetingCounts: Sendable, Equatable {
    public var targeting: Targeting
    public var unread: Int
    public var unseen: Int
    public var noInteraction: Int
    public var total: Int
    public init(targeting: Targeting, unread: Int = 0, unseen: Int = 0, noInteraction: Int = 0, total: Int = 0) {
        self.targeting = targeting; self.unread = unread; self.unseen = unseen
        self.noInteraction = noInteraction; self.total = total
    }

    public var badge: Badge { Badge(unread: unread, unseen: unseen) }
}

/// A token shared through the store (`NotificationStore.sharedToken`), and when it was made.
public struct SharedToken: Sendable, Equatable {
    public let value: String
    public let issuedAt: Millis
    public init(value: String, issuedAt: Millis) { self.value = value; self.issuedAt = issuedAt }
}

/// The reads every store serves. A `StoreReader` serves them on another thread.
public protocol StoreReading: AnyObject {
    /// Opaque, stable for as long as the store's history lasts.
    var epoch: String { get }
    func feed(_ user: UserKey) throws(StoreError) -> FeedState
    func notification(_ user: UserKey, id: String) throws(StoreError) -> Notification?
    /// Changes with `seq > after`, in seq order, at most `limit`.
    func changes(_ user: UserKey, after: Int64, limit: Int) throws(StoreError) -> [ChangeRecord]
    /// Live notifications in history order, strictly after `after` (any
    /// position, of a notification or not). A store may read them in id
    /// order: every stored notification's id is made from its `createdAt`
    /// (`NotificationID`), which gives the same order.
    func history(_ user: UserKey, after: HistoryKey?, limit: Int) throws(StoreError) -> [Notification]
    /// Live notification counts of `user`, one entry per distinct targeting
    /// with at least one live notification. Targetings are the same when
    /// their platforms are the same set and their tag expressions have the
    /// same source; `targeting` lists the platforms in `Platform.allCases`
    /// order, without repeats.
    func counts(_ user: UserKey) throws(StoreError) -> [TargetingCounts]
    func devices(_ user: UserKey) throws(StoreError) -> [Device]
    /// The user's saved preferences (SPEC section 12), `Preferences.unsaved`
    /// when none are; `critical` empty (the app's config has it). Read for
    /// every publish: one lookup by the user's key, or the feed cache's.
    func preferences(_ user: UserKey) throws(StoreError) -> Preferences
    /// The committed heads of the feeds of `users` (a user with no feed yet
    /// may be left out), read without taking locks: for comparing many
    /// followed feeds at once (`FeedAudit`).
    func heads(_ users: [UserKey]) throws(StoreError) -> [UserKey: Int64]
    /// The registrations of `users` (one with none may be left out): for
    /// checking many connected devices at once (`Engine.subscribed`).
    func devices(of users: [UserKey]) throws(StoreError) -> [UserKey: [Device]]
    /// The registrations of `users` that hold a push handle; a user with
    /// none is left out. Asked for every batch's users (`PushDispatch`),
    /// most of whom have none: it costs them a lookup, not a copy.
    func pushDevices(of users: [UserKey]) throws(StoreError) -> [UserKey: [Device]]
    /// The earliest time `deadline` falls for a stored notification, nil
    /// when it falls for none: whether its sweep has anything to do, asked
    /// off the engine thread (`Maintenance`). It may be earlier than the
    /// truth, never later.
    func next(_ deadline: Deadline) throws(StoreError) -> Millis?
    /// Outside a transaction: brings the query planner's statistics up to
    /// date where the tables outgrew them (PostgreSQL); the tables it did.
    /// Only reads the tables (ANALYZE samples them), so a reader connection
    /// may run it, off the engine (`Maintenance`).
    func refreshPlannerStatistics() throws(StoreError) -> [String]
}

extension NotificationStore {
    public var lastCommitReachedStore: Bool { true }
}

extension StoreReading {
    public func refreshPlannerStatistics() throws(StoreError) -> [String] { [] }

    public func heads(_ users: [UserKey]) throws(StoreError) -> [UserKey: Int64] {
        var out: [UserKey: Int64] = [:]
        for u in users { out[u] = try feed(u).head }
        return out
    }

    public func devices(of users: [UserKey]) throws(StoreError) -> [UserKey: [Device]] {
        var out: [UserKey: [Device]] = [:]
        for u in users { out[u] = try devices(u) }
        return out
    }

    public func pushDevices(of users: [UserKey]) throws(StoreError) -> [UserKey: [Device]] {
        var out: [UserKey: [Device]] = [:]
        for u in users {
            let all = try devices(u)
            if all.contains(where: { $0.push != nil }) { out[u] = all.filter { $0.push != nil } }
        }
        return out
    }

    public func device(_ user: UserKey, id: String) throws(StoreError) -> Device? {
        try devices(user).first { $0.deviceId == id }
    }
}

/// A read-only connection to a store, used by one thread (not the owner's) at a time.
public protocol StoreReader: StoreReading {
    /// Runs `body` on one consistent snapshot: it sees every commit that
    /// returned before `read` began and nothing committed after.
    func read<T>(_ body: (StoreReading) throws(StoreError) -> T) throws(StoreError) -> T
}

/// The storage interface every store implements (memory, SQLite, ...).
///
/// Invariants every implementation keeps:
/// - Per user, `seq` is assigned by the store, strictly increasing and never
///   reused, also across restarts of a durable store.
/// - `upsert`/`delete` write the notification, its change and the user's
///   counts together: a reader never sees one without the others.
/// - Between `begin()` and `commit()` writes are one atomic unit; `rollback()`
///   undoes all of them, including seq assignment. A write that returned
///   from `commit()` is durable as the store's durability setting promises,
///   or, for a store with a `commitSync`, once a later `sync()` returned.
/// - Only one thread calls a store at a time (the engine's); other threads
///   read through their own `makeReader()`.
/// What a transaction reads besides `StoreReading`: lookups that writes
/// depend on. The gateway hands these to everything that runs in a batch,
/// and the writes only to its feed transaction (`FeedTransaction`), which
/// records each write's effects.
public protocol StoreLookups: StoreReading {
    func notification(_ user: UserKey, appNotificationId: String) throws(StoreError) -> Notification?
    /// Every user of `app` with at least one registered device.
    func usersWithDevices(app: String) throws(StoreError) -> [(user: String, devices: [Device])]
    /// The registration holding the handle whose `PushHandle.key` is `key` in `app`.
    func pushHolder(app: String, key: String) throws(StoreError) -> (user: String, deviceId: String)?
    /// How many pushes wait or are in flight (`herald_push_pending`): a
    /// count the store keeps in the transactions that add and remove them,
    /// not a scan of the outbox, which may be long.
    func pendingPushes() throws(StoreError) -> Int
    /// How many of `user`'s pushes wait or are in flight, by device (the
    /// inspector's): a scan of the user's rows only (by their index).
    func pendingPushes(_ user: UserKey) throws(StoreError) -> [String: Int]
    /// How many webhook deliveries wait or are in flight
    /// (`herald_webhook_pending`), kept as `pendingPushes` is.
    func pendingWebhooks() throws(StoreError) -> Int
    /// How many deliveries to `url` of `app` wait or are in flight, counted
    /// up to `limit` (the inspector's: a dead endpoint may hold a day of
    /// events, and a count costs what it counts).
    func pendingWebhooks(app: String, url: String, upTo limit: Int) throws(StoreError) -> Int
    /// The token kept under `name` (SPEC section 10: one APNs provider
    /// token per key for the deployment), nil when none is.
    func sharedToken(_ name: String) throws(StoreError) -> SharedToken?
}

public protocol NotificationStore: StoreLookups, WebhookOutbox {
    func begin() throws(StoreError)
    func commit() throws(StoreError)
    /// Whether the last `commit()` reached the store: only then does it say
    /// the store works (PostgreSQL sends nothing for a transaction with no
    /// statement in it).
    var lastCommitReachedStore: Bool { get }
    func rollback()
    /// Inside a transaction, takes now what the writes to `users` (and to
    /// the users of `lookups`) would take on first touch (PostgreSQL: each
    /// user's feed lock), in one order every node shares, so that
    /// transactions of several users never wait on each other in a cycle;
    /// and may read the notifications `lookups` name at once, for the
    /// transaction's later lookups. A `.pushHolder` lookup claims the
    /// handle's holder too, as found now. Stores with a single writer need
    /// nothing.
    func claim(_ users: [UserKey], lookups: [NotificationLookup]) throws(StoreError)
    /// Another node committed `records`, changes of `user` in seq order
    /// (from the bus): a store that keeps what it knows of feeds between
    /// transactions (PostgreSQL) may follow. Outside a transaction or in one.
    func noteCommitted(_ user: UserKey, _ records: [ChangeRecord])

    /// Saves `n` (new, or replacing the stored notification with its id) and
    /// appends an upsert change with the user's next seq.
    func upsert(_ user: UserKey, _ n: Notification, previous: Notification?, at: Millis) throws(StoreError) -> ChangeRecord
    /// Removes `n` and appends a delete change with the user's next seq.
    func delete(_ user: UserKey, _ n: Notification, reason: DeleteReason, at: Millis) throws(StoreError) -> ChangeRecord
    /// Saves `p` as the user's preferences (without its `critical`, which
    /// the change carries) and appends a preferences change with the
    /// user's next seq.
    func savePreferences(_ user: UserKey, _ p: Preferences, at: Millis) throws(StoreError) -> ChangeRecord

    /// Notifications of `partition`'s users whose `deadline` falls by
    /// `until`, earliest first: each partition sweeps its own users, whose
    /// feeds only its engine writes (a store several partitions share,
    /// PostgreSQL, selects them in SQL, skipping rows another node holds).
    func due(_ deadline: Deadline, until: Millis, limit: Int, in partition: Partition) throws(StoreError) -> [(UserKey, Notification)]
    /// Drops changes recorded before `before`, raising each feed's floor: at
    /// most about `limit` of them per call (changes recorded at one instant
    /// may go together), so that one call never holds the store for long.
    /// `more`: some may be left for another call.
    func pruneChanges(before: Millis, limit: Int) throws(StoreError) -> Pruned

    func saveDevice(_ user: UserKey, _ device: Device) throws(StoreError)
    func deleteDevice(_ user: UserKey, id: String) throws(StoreError) -> Bool
    /// Drops registrations not seen since `before`.
    func pruneDevices(lastSeenBefore before: Millis) throws(StoreError) -> Int

    // The push outbox (SPEC section 10): written in the same transactions
    // as the changes it wakes devices for, taken by whichever node claims it.

    /// Records a push for `deviceId` of `user`, due now; a new tap, no
    /// sooner than `spaceTaps` said. A tap joins the device's tap already
    /// waiting or in flight, if any (`PushJob`). With `claimUntil`, a new
    /// row due now is also claimed until then, as `claimPushes` would, and
    /// returned: its sender need not ask again (nil when the push joined a
    /// row that was there, or waits).
    @discardableResult
    func enqueuePush(_ user: UserKey, deviceId: String, _ message: PushMessage, at: Millis,
                     claimUntil: Millis?) throws(StoreError) -> PushJob?
    /// Up to `limit` pushes due by `now` that nobody holds, oldest due
    /// first, now held until `until`: a node that dies holding them lets
    /// them go when that passes. PostgreSQL skips rows another node is
    /// claiming (`FOR UPDATE SKIP LOCKED`), so each push has one sender.
    func claimPushes(now: Millis, until: Millis, limit: Int) throws(StoreError) -> [PushJob]
    /// A push sent or given up: removed, unless its tap was replaced since
    /// it was claimed (`generation` moved), which is then due at once.
    func finishPush(_ job: PushJob) throws(StoreError)
    /// A push to send again at `at`, one more attempt counted.
    func retryPush(_ job: PushJob, at: Millis) throws(StoreError)
    /// A tap to `deviceId` was just sent: the device's next tap is due no
    /// sooner than `until`, the one waiting (if any) included. Kept until
    /// `pruneDevices` passes `until`.
    func spaceTaps(_ user: UserKey, deviceId: String, until: Millis) throws(StoreError)
    /// Drops every push waiting for `deviceId`: its handle is dead, removed or moved.
    func dropPushes(_ user: UserKey, deviceId: String) throws(StoreError)

    // Tokens every process and node of the deployment signs with at a time
    // (SPEC section 10: one APNs provider token per key), by name.

    /// Keeps `token` under `name` in place of the one issued at `replacing`
    /// (nil: in place of none), unless another writer replaced that one
    /// first: then false, and nothing changed. So of processes renewing at
    /// once, one wins and the others read its token.
    func replaceSharedToken(_ name: String, with token: SharedToken, replacing: Millis?) throws(StoreError) -> Bool

    /// Whether the store's data is one database that other partitions and
    /// nodes write too (PostgreSQL), rather than this partition's alone:
    /// what is counted store-wide is then counted by one partition, and
    /// what another partition holds is found here.
    var isShared: Bool { get }

    /// A read-only connection for one other thread, or nil when only the
    /// owner's thread may read this store (MemoryStore).
    func makeReader() throws(StoreError) -> StoreReader?

    /// Set when `commit()` returns before its writes are durable: its
    /// `sync()` then makes them so. nil when `commit()` itself is durable.
    var commitSync: CommitSync? { get }
}

/// What finishes the commits of a store whose `commit()` hands its writes to
/// the OS without waiting for the disk (SQLite at full durability, opened
/// with `deferredSync`): the engine runs the next batch on its thread while
/// another thread syncs the last one, and acknowledges a batch only once a
/// sync that began after its commit returned.
public protocol CommitSync: AnyObject, Sendable {
    /// Makes every commit that returned before this call durable. Called
    /// from one thread at a time; a failure means the disk may have lost
    /// writes that the store already shows.
    func sync() throws(StoreError)
}

extension NotificationStore {
    public var commitSync: CommitSync? { nil }
    public var isShared: Bool { false }
    public func claim(_ users: [UserKey], lookups: [NotificationLookup]) throws(StoreError) {}
    public func claim(_ users: [UserKey]) throws(StoreError) { try claim(users, lookups: []) }
    public func noteCommitted(_ user: UserKey, _ records: [ChangeRecord]) {}

    /// Every user's notifications whose `deadline` fell by `until`.
    public func due(_ deadline: Deadline, until: Millis, limit: Int) throws(StoreError) -> [(UserKey, Notification)] {
        try due(deadline, until: until, limit: limit, in: .whole)
    }

    /// Drops every change recorded before `before` in one call; how many.
    public func pruneChanges(before: Millis) throws(StoreError) -> Int {
        try pruneChanges(before: before, limit: .max).changes
    }
}

/// The webhook outbox's writes (SPEC section 13): the push outbox's
/// mechanism (a row due at a time, claimed under a lease, PostgreSQL
/// skipping rows another node claims, retried at a later time, counted by
/// the store's own transactions), one row per event and endpoint.
/// Engine thread, inside a transaction (`FeedTransaction.webhookOutbox`).
public protocol WebhookOutbox: AnyObject {
    /// Records `body`, event `eventId`, for endpoint `url` of `app`, due now.
    func enqueueWebhook(app: String, url: String, eventId: String, body: [UInt8], at: Millis) throws(StoreError)
    /// Up to `limit` deliveries to `url` of `app` due by `now` that nobody
    /// holds, oldest due first, now held until `until` (as `claimPushes`).
    func claimWebhooks(app: String, url: String, now: Millis, until: Millis, limit: Int) throws(StoreError) -> [WebhookJob]
    /// A delivery done or given up: removed.
    func finishWebhook(_ job: WebhookJob) throws(StoreError)
    /// A delivery to try again at `at`: one more attempt counted when it
    /// was `attempted` (not when it never left, `WebhookOutcome.notSent`).
    func retryWebhook(_ job: WebhookJob, at: Millis, attempted: Bool) throws(StoreError)
    /// Drops deliveries recorded before `before` (their 24 hours ran out,
    /// or their endpoint left the config): how many, at most `limit`.
    func dropWebhooks(committedBefore before: Millis, limit: Int) throws(StoreError) -> Int
}

/// A row of an outbox (push or webhook), as the stores' shared claim and retry code sees it.
public protocol OutboxJob: Sendable {
    var id: Int64 { get }
    var attempts: Int { get set }
}

extension PushJob: OutboxJob {}
extension WebhookJob: OutboxJob {}

/// One webhook event waiting for one endpoint (`NotificationStore.claimWebhooks`).
public struct WebhookJob: Sendable, Equatable {
    public let id: Int64
    public let app: String
    public let url: String
    /// `webhook-id`: one per event, the same for every endpoint and retry.
    public let eventId: String
    public let body: [UInt8]
    /// When the change behind it committed: the latency metric's start, and its 24 hours'.
    public let committedAt: Millis
    public var attempts: Int

    public init(id: Int64, app: String, url: String, eventId: String, body: [UInt8], committedAt: Millis, attempts: Int = 0) {
        self.id = id; self.app = app; self.url = url; self.eventId = eventId; self.body = body
        self.committedAt = committedAt; self.attempts = attempts
    }
}

/// What one `pruneChanges` call did.
public struct Pruned: Equatable, Sendable {
    /// Changes it dropped (or, when a notification still points at one,
    /// took below the feed's floor).
    public var changes: Int
    /// Whether changes older than its cutoff may remain for another call.
    public var more: Bool
    public init(changes: Int, more: Bool) { self.changes = changes; self.more = more }
}

/// A notification a transaction will look up, named before it runs (`claim`).
public enum NotificationLookup: Hashable, Sendable {
    case id(UserKey, String)
    case appNotificationId(UserKey, String)
    /// The registration holding the push handle whose `PushHandle.key` is
    /// the string, in the user's app, which the transaction takes for the
    /// user (and writes: the handle moves). Its user is claimed with the
    /// others (PostgreSQL: locked in the one order) rather than found, and
    /// locked, while the transaction runs.
    case pushHolder(UserKey, key: String)

    public var user: UserKey {
        switch self {
        case .id(let u, _), .appNotificationId(let u, _), .pushHolder(let u, _): u
        }
    }

    /// What registering `registration` for a device of `user` looks up: the
    /// holder of the handle it sets, if any.
    public static func registering(_ registration: DeviceRegistration?, for user: UserKey) -> [NotificationLookup] {
        guard case .set(let handle)? = registration?.push else { return [] }
        return [.pushHolder(user, key: handle.key)]
    }
}

/// Which devices are connected to which gateway node, kept where all nodes
/// of one store can read it (docs/ARCHITECTURE.md, "Presence across
/// nodes"). Each node records its own devices under its node id, behind a
/// lease it renews; records of a node whose lease ran out are not answered.
/// Called on the engine thread, inside its transactions.
public protocol ClusterDirectory: AnyObject {
    /// Extends `node`'s lease to `millis` from now (the store's clock).
    /// False when the node held none, so its records may be gone (a first
    /// start, a lease pruned after it lapsed, a database restarted after a
    /// crash): the node must write them all again.
    func renewLease(node: String, millis: Int64) throws(StoreError) -> Bool
    /// Records that `device` of `user` is connected to `node` by `transport`
    /// (for as long as the lease runs, or at most `millis` when given), or,
    /// with nil, that it is not.
    func setConnection(node: String, _ user: UserKey, device: String, transport: String?, millis: Int64?) throws(StoreError)
    /// `user`'s devices connected to nodes other than `node` whose lease
    /// runs, with their transports (a device may have several).
    func connections(_ user: UserKey, otherThan node: String) throws(StoreError) -> [(device: String, transport: String)]
    /// Drops the records of nodes whose lease lapsed more than a minute
    /// ago, and `node`'s own expired ones.
    func pruneConnections(node: String) throws(StoreError)
    /// A node stopping: its lease and records go at once.
    func retire(node: String) throws(StoreError)
}

/// What a reader of a store that keeps presence (`ClusterDirectory`) also
/// answers: the inspector's view of an app across its nodes.
public protocol PresenceReading {
    /// `app`'s devices connected to each node whose lease runs, by node id
    /// as recorded and transport.
    func connectedDevices(app: String) throws(StoreError) -> [(node: String, transport: String, devices: Int)]
}
