import HeraldCore

/// The store several gateway nodes share (`--store postgres://...`): one
/// PostgreSQL database, written by each node's engine thread on its own
/// connection; other threads read through `makeReader()`.
///
/// Group commit: the engine runs a batch between `begin()` and `commit()`,
/// one PostgreSQL transaction (READ COMMITTED). Every write method also
/// works outside `begin()`/`commit()`, as its own transaction. A statement
/// that fails inside a transaction dooms all of it (PostgreSQL runs nothing
/// more of it): the caller rolls back.
///
/// Cross-node ordering (docs/ARCHITECTURE.md): inside a transaction the
/// first read or write of a user locks that user's `feeds` row until commit
/// or rollback (`lock`), and a user's seq is `head + 1` of that row. So the
/// transactions touching one user run one after another across all nodes,
/// and each reads what the previous one committed. A seq is therefore
/// never committed after a larger seq of the same user: a device that has
/// read up to seq N never later finds a change below N that it skipped.
///
/// Deadlocks: two batches locking two users in opposite orders would wait
/// on each other. So a batch first `claim`s every user it names, in
/// (app, user) order, the one order all nodes share, with the holder of
/// each push handle it takes (`.pushHolder` lookups, read before locking);
/// only users found while it runs are locked later: those of an app-wide
/// send by tags (in a batch of its own, in order), and a handle's holder
/// that changed since the claim, locked `NOWAIT` (`pushHolder`: a refusal
/// is a conflict rather than a wait out of order). A deadlock that still
/// happens (with an outside session; PostgreSQL aborts one side after
/// `deadlock_timeout`, 1 s by default) is a `StoreError` marked `conflict`,
/// and the engine runs that batch again.
///
/// The epoch is made by the first migration and stored in the database, so
/// every node of one database has the same one, for the life of the
/// database.
///
/// Expiry: `expiring` locks the notifications it returns and their users
/// with `FOR UPDATE ... SKIP LOCKED`, so two nodes sweeping at once divide
/// the due notifications between them instead of both deleting (and
/// announcing) the same one; what another node holds is left for the next
/// sweep.
///
/// Connection loss: the call fails with a `StoreError` (the gateway answers
/// 503); the next `begin()`, or call outside a transaction, connects again.
public final class PostgresStore: NotificationStore {
    public let epoch: String
    private let url: String
    /// Internal for tests (a lost connection).
    let db: PostgresConnection
    private let reads: PostgresReads
    /// Inside `begin()` … `commit()`/`rollback()`.
    private var inTransaction = false
    /// The open transaction was started on the server: `BEGIN` waits for
    /// its first statement, so a batch that touches no data (it only
    /// delivers what came over the bus) costs no round trip.
    private var started = false
    /// The users whose feeds row the open transaction holds locked, with
    /// their head: the seqs it assigned, or what it read under the lock.
    private var heads: [UserKey: Int64] = [:]
    /// Notifications of locked users as the open transaction has them
    /// (nil: none), read ahead by `claim` and kept up by its own writes.
    private var known: [NotificationLookup: Notification?] = [:]
    /// The open transaction's changes, per user, in seq order: a user's
    /// head when locked is `heads[user]` less their count.
    private var written: [UserKey: [ChangeRecord]] = [:]
    /// Preferences of locked users as the open transaction has them: read
    /// (from `cache` when it knows them at the locked head) or saved.
    private var knownPreferences: [UserKey: Preferences] = [:]
    /// Feeds as last committed, which spare `claim` its reads (see there).
    private var cache: PostgresFeedCache
    /// The session `cache` was learned on (`PostgresConnection.sessions`).
    private var cacheSession = 0
    /// `cache`'s budget unless given: a few thousand users' recent
    /// notifications.
    public static let defaultCacheBytes = 32 << 20
    /// The `before` of the prune call that last swept zeroed counts rows.
    private var countsSweptAt: Millis?
    /// How often that sweep (a scan of `counts`) runs.
    static let countsSweepEvery: Millis = 600_000

    /// Checks the form of a connection URL without connecting: its
    /// host:port/database, or nil when it is not one libpq accepts.
    public static func describe(url: String) -> String? { PostgresConnection.describe(url) }

    /// Connects to the database at `url` (a libpq URL or key=value string)
    /// and migrates it to the current schema.
    public init(url: String, cacheBytes: Int = defaultCacheBytes) throws(StoreError) {
        self.url = url
        db = try PostgresConnection(url: url)
        reads = PostgresReads(db: db)
        epoch = try PostgresSchema.migrate(db)
        cache = PostgresFeedCache(budget: cacheBytes)
    }

    // MARK: Transactions

    /// Refuses work inside a transaction that an error doomed or whose
    /// connection is gone, and starts one not started yet; outside one,
    /// connects again if it was lost.
    private func check() throws(StoreError) {
        if !inTransaction { return try db.reconnectIfLost() }
        if !started {
            try db.beginPipelined()
            started = true
        }
        if !db.isConnected { throw db.error("transaction", "the connection was lost; roll back and retry") }
        if db.transactionFailed { throw db.error("transaction", "rolled back after an earlier error; roll back and retry") }
    }

    public func begin() throws(StoreError) {
        guard !inTransaction else { throw db.error("begin", "inside an open transaction") }
        inTransaction = true
        started = false
        db.lockWaitRanOut = false
    }

    public private(set) var lastCommitReachedStore = true

    public func commit() throws(StoreError) {
        guard inTransaction else { return }
        defer { ended() }
        lastCommitReachedStore = started
        guard started else { return }
        do throws(StoreError) {
            try check()
            try db.finish("COMMIT")
        } catch {
            undone()
            throw error
        }
        followSession()
        for (user, head) in heads {
            let records = written[user] ?? []
            cache.committed(user, from: head - Int64(records.count), records, preferences: knownPreferences[user])
        }
    }

    public func rollback() {
        guard inTransaction else { return }
        undone()
        ended()
    }

    /// Rolls back what reached the server; forgets what the cache had of
    /// its users, which may be why it failed (`claim`).
    private func undone() {
        cache.forget(heads.keys)
        db.abandon()
        if db.inTransaction { _ = try? db.script("ROLLBACK") }
        fenceIfLockWaitRanOut()
    }

    private func ended() {
        inTransaction = false
        heads.removeAll()
        known.removeAll()
        written.removeAll()
        knownPreferences.removeAll()
    }

    /// Another node committed `records` (from the bus): the cache follows.
    public func noteCommitted(_ user: UserKey, _ records: [ChangeRecord]) {
        followSession()
        cache.heard(user, records)
    }

    /// Forgets what the cache learned on an earlier session.
    private func followSession() {
        guard cacheSession != db.sessions else { return }
        cache.forgetAll()
        cacheSession = db.sessions
    }

    /// Said when this store ends another node's session (`fenceFrozenNodes`).
    public var warn: (String) -> Void = { _ in }

    /// How long a node's session must have sent nothing, inside a
    /// transaction, to be taken for frozen: a busy engine, even in a long
    /// maintenance transaction, sends a statement every few milliseconds.
    static let frozenAfterMillis: Int64 = 10_000

    /// Sessions of other nodes whose lease lapsed, inside a transaction,
    /// that have sent no statement for `$1` ms and wait for their client: a
    /// node frozen in the middle of a batch. Sessions of this database
    /// role only, which it may end.
    private static let frozenSQL = """
        WITH frozen AS MATERIALIZED (
            SELECT a.pid, n.node FROM pg_stat_activity a JOIN herald_nodes n ON a.application_name = 'herald/' || n.node
            WHERE n.lease_until < now() AND a.xact_start IS NOT NULL AND a.query_start < now() - $1 * interval '1 millisecond'
              AND a.wait_event = 'ClientRead' AND a.usename = current_user AND a.datname = current_database()
              AND a.pid <> pg_backend_pid()
        )
        SELECT node FROM frozen WHERE pg_terminate_backend(pid)
        """

    /// After a transaction whose lock wait ran out (`lock_timeout`, at a
    /// statement or at COMMIT) rolled back: ends the sessions of frozen
    /// nodes.
    private func fenceIfLockWaitRanOut() {
        guard db.lockWaitRanOut else { return }
        db.lockWaitRanOut = false
        for node in fenceFrozenNodes(silentFor: Self.frozenAfterMillis) {
            warn("ended the database session of node \(node), frozen in a transaction for over "
                 + "\(Self.frozenAfterMillis / 1000) s with its lease lapsed, holding locks other writes waited for")
        }
    }

    /// Ends the sessions of frozen nodes (`frozenSQL`); answers their nodes.
    /// Such a node holds its users' locks, and every node's writes to those
    /// users would wait until it resumes; once its session is gone they go
    /// on, and its batch fails when it resumes (503). Outside a transaction.
    func fenceFrozenNodes(silentFor millis: Int64) -> [String] {
        guard let r = try? db.query(Self.frozenSQL, [.int(millis)]) else { return [] }
        return (0..<r.count).map { r.text($0, 0) ?? "?" }
    }

    /// Runs a multi-statement write atomically: in the open transaction,
    /// else as its own.
    private func write<T>(_ body: () throws(StoreError) -> T) throws(StoreError) -> T {
        let own = !inTransaction
        if own { try begin() }
        do throws(StoreError) {
            try check()
            let r = try body()
            if own { try commit() }
            return r
        } catch {
            if own { rollback() }
            throw error
        }
    }

    private static func key(_ user: UserKey) -> [PostgresValue] { [.text(user.app), .text(user.user)] }

    /// Inside a transaction, locks `user`'s feeds row (creating it at head 0
    /// if missing) until the transaction ends, once per transaction, and
    /// notes its head: see the class comment. Outside one, nothing to hold
    /// a lock for.
    private func lock(_ user: UserKey) throws(StoreError) {
        guard inTransaction, heads[user] == nil else { return }
        let lockSQL = "SELECT head FROM feeds WHERE app = $1 AND user_id = $2 FOR UPDATE"
        var r = try db.query(lockSQL, Self.key(user))
        if r.count == 0 {
            // Another node creating it at once: ours waits for its commit, then does nothing.
            try db.execute("INSERT INTO feeds (app, user_id, head, floor) VALUES ($1, $2, 0, 0) ON CONFLICT DO NOTHING",
                           Self.key(user))
            r = try db.query(lockSQL, Self.key(user))
        }
        guard r.count == 1 else { throw db.error("lock", "no feed row for \(user)") }
        heads[user] = r.int64(0, 0)
    }

    /// Locks the feeds rows of `users` not locked yet, creating missing ones
    /// at head 0, in (app, user) order, and notes their heads; reads the
    /// notifications `lookups` name into `known` (their users are then
    /// locked: nothing but this transaction changes them). Per 500 users
    /// one statement takes the locks in the order of its input (an `ON
    /// CONFLICT DO UPDATE` locks the existing row even when its `WHERE`
    /// updates nothing); the reads of the heads, under the locks, and of the
    /// notifications follow in the same pipeline: one round trip for all.
    ///
    /// When `cache` knows all of it, nothing is read: the heads it has are
    /// checked under the locks instead (`herald_expect_heads`, migration
    /// 4), in the pipeline, and a head that moved fails the transaction as
    /// a conflict when it commits. Nothing of such a transaction reaches
    /// anyone before then (the engine answers and delivers after commit),
    /// and it runs again reading, its users forgotten by the cache.
    ///
    /// `.pushHolder` lookups: each handle's holder is read first (a plain
    /// read, one more round trip) and locked with the users, in the one
    /// order. A holder that changes after this read is locked without
    /// waiting, by `pushHolder`.
    public func claim(_ users: [UserKey], lookups: [NotificationLookup]) throws(StoreError) {
        guard inTransaction else { return }
        var handles: [(app: String, key: String)] = []
        var lookups = lookups
        lookups.removeAll { l in
            guard case .pushHolder(let u, let key) = l else { return false }
            handles.append((u.app, key))
            return true
        }
        let holders = handles.isEmpty ? [] : try holders(of: handles)
        let unlocked = Set(users + lookups.map(\.user) + holders).filter { heads[$0] == nil }
        let unknown = Array(Set(lookups.filter { known[$0] == nil }))
        guard !unlocked.isEmpty || !unknown.isEmpty else { return }
        try check()
        followSession()
        let lockedAt = heads.reduce(into: [UserKey: Int64]()) { out, e in
            out[e.key] = e.value - Int64(written[e.key]?.count ?? 0)
        }
        let served = cache.serve(unlocked, unknown, lockedAt: lockedAt)
        let locking = PostgresReads.chunked(unlocked.sorted())
        for part in locking {
            try db.send("""
                INSERT INTO feeds (app, user_id, head, floor)
                SELECT app, user_id, 0, 0 FROM unnest($1::text[], $2::text[]) AS u(app, user_id)
                ON CONFLICT (app, user_id) DO UPDATE SET head = feeds.head WHERE false
                """, PostgresReads.userArrays(part))
            if let served {
                try db.send("SELECT herald_expect_heads($1::text[], $2::text[], $3::bigint[])",
                            PostgresReads.userArrays(part) + [.textArray(part.map { String(served.heads[$0]!) })])
            }
        }
        if let served {
            heads.merge(served.heads) { _, cached in cached }
            known.merge(served.known) { _, cached in cached }
            return
        }
        let reading = PostgresReads.chunked(unknown)
        let rows = try db.queries(locking.map { (PostgresReads.headsSQL, PostgresReads.userArrays($0)) }
                                  + reading.map(Self.readAheadStatement))
        for (part, r) in zip(locking, rows) {
            try reads.addHeads(r, to: &heads)
            guard part.allSatisfy({ heads[$0] != nil }) else { throw db.error("claim", "a feed row is missing") }
        }
        for (part, r) in zip(reading, rows.dropFirst(locking.count)) {
            for l in part { known.updateValue(nil, forKey: l) }
            for (i, n) in try reads.notifications(r, 2).enumerated() {
                guard let app = r.text(i, 0), let user = r.text(i, 1) else { throw reads.corrupt("notification") }
                remember(UserKey(app: app, user: user), n)
            }
        }
    }

    /// The users holding the handles of `(app, key)` pairs, as committed
    /// now: read without locking anything, so it waits for no one.
    private func holders(of handles: [(app: String, key: String)]) throws(StoreError) -> [UserKey] {
        try check()
        let r = try db.query("""
            SELECT d.app, d.user_id FROM devices d
            JOIN unnest($1::text[], $2::text[]) AS k(app, push_key) ON d.app = k.app AND d.push_key = k.push_key
            """, [.textArray(handles.map(\.app)), .textArray(handles.map(\.key))])
        return try (0..<r.count).map { i throws(StoreError) in
            guard let app = r.text(i, 0), let user = r.text(i, 1) else { throw reads.corrupt("device") }
            return UserKey(app: app, user: user)
        }
    }

    /// The notifications of arrays of (app, user, id) and of (app, user,
    /// appNotificationId).
    private static let readAheadSQL = """
        SELECT n.app, n.user_id, \(PostgresReads.storedNotification) FROM \(PostgresReads.notificationsWithChanges)
        JOIN unnest($1::text[], $2::text[], $3::text[]) AS k(app, user_id, id)
          ON n.app = k.app AND n.user_id = k.user_id AND n.id = k.id
        UNION ALL
        SELECT n.app, n.user_id, \(PostgresReads.storedNotification) FROM \(PostgresReads.notificationsWithChanges)
        JOIN unnest($4::text[], $5::text[], $6::text[]) AS k(app, user_id, anid)
          ON n.app = k.app AND n.user_id = k.user_id AND n.app_notification_id = k.anid
        """

    /// `readAheadSQL` with the arrays of `lookups`.
    private static func readAheadStatement(_ lookups: ArraySlice<NotificationLookup>) -> (sql: String, args: [PostgresValue]) {
        var byId: [[String]] = [[], [], []], byApp: [[String]] = [[], [], []]
        for l in lookups {
            switch l {
            case .id(let u, let id): byId[0].append(u.app); byId[1].append(u.user); byId[2].append(id)
            case .appNotificationId(let u, let a): byApp[0].append(u.app); byApp[1].append(u.user); byApp[2].append(a)
            case .pushHolder: break  // not read ahead (`claim`)
            }
        }
        return (readAheadSQL, (byId + byApp).map(PostgresValue.textArray))
    }

    /// Notes what the open transaction now has for `n`'s id and
    /// appNotificationId: `n`, or none once deleted.
    private func remember(_ user: UserKey, _ n: Notification, deleted: Bool = false) {
        guard inTransaction else { return }
        known.updateValue(deleted ? nil : n, forKey: .id(user, n.id))
        known.updateValue(deleted ? nil : n, forKey: .appNotificationId(user, n.appNotificationId))
    }

    /// The reads of one user, after `check` and `lock`.
    private func reading(_ user: UserKey) throws(StoreError) -> PostgresReads {
        try check()
        try lock(user)
        return reads
    }

    // MARK: Reads

    public func feed(_ user: UserKey) throws(StoreError) -> FeedState { try reading(user).feed(user) }

    /// Outside a transaction, what other nodes committed; inside, also this
    /// transaction's writes. Takes no locks either way.
    public func heads(_ users: [UserKey]) throws(StoreError) -> [UserKey: Int64] {
        try check()
        return try reads.heads(users)
    }

    public func next(_ deadline: Deadline) throws(StoreError) -> Millis? {
        try check()
        return try reads.next(deadline)
    }

    public func notification(_ user: UserKey, id: String) throws(StoreError) -> Notification? {
        if let hit = known[.id(user, id)] { return hit }
        return try reading(user).notification(user, id: id)
    }

    public func notification(_ user: UserKey, appNotificationId: String) throws(StoreError) -> Notification? {
        if let hit = known[.appNotificationId(user, appNotificationId)] { return hit }
        return try reading(user).notification(user, appNotificationId: appNotificationId)
    }

    public func changes(_ user: UserKey, after: Int64, limit: Int) throws(StoreError) -> [ChangeRecord] {
        try reading(user).changes(user, after: after, limit: limit)
    }

    public func history(_ user: UserKey, after: HistoryKey?, limit: Int) throws(StoreError) -> [Notification] {
        try reading(user).history(user, after: after, limit: limit)
    }

    public func counts(_ user: UserKey) throws(StoreError) -> [TargetingCounts] { try reading(user).counts(user) }

    public func devices(_ user: UserKey) throws(StoreError) -> [Device] { try reading(user).devices(user) }

    /// Inside a transaction: once per user, without a read when the cache
    /// knows them at the head the user was locked at.
    public func preferences(_ user: UserKey) throws(StoreError) -> Preferences {
        if let p = knownPreferences[user] { return p }
        let reads = try reading(user)
        guard inTransaction, let head = heads[user] else { return try reads.preferences(user) }
        var p = cache.preferences(user, at: head - Int64(written[user]?.count ?? 0))
        if p == nil { p = try reads.preferences(user) }
        knownPreferences[user] = p
        return p!
    }

    /// Committed registrations (and this transaction's), taking no locks.
    public func devices(of users: [UserKey]) throws(StoreError) -> [UserKey: [Device]] {
        try check()
        return try reads.devices(of: users)
    }

    public func pushDevices(of users: [UserKey]) throws(StoreError) -> [UserKey: [Device]] {
        try check()
        return try reads.pushDevices(of: users)
    }

    /// The notifications of arrays of (app, user, id), in the arrays' order.
    private static let dueSQL = """
        SELECT n.app, n.user_id, \(PostgresReads.storedNotification) FROM \(PostgresReads.notificationsWithChanges)
        JOIN unnest($1::text[], $2::text[], $3::text[]) WITH ORDINALITY AS k(app, user_id, id, i)
          ON n.app = k.app AND n.user_id = k.user_id AND n.id = k.id
        ORDER BY k.i
        """

    /// Earliest first, skipping what another transaction holds (see
    /// the class comment); inside a transaction the rows and their users
    /// stay locked until it ends. Locks first, then reads: a row another
    /// node changed while this waited is locked in its new version, but a
    /// join in the same statement would still see the change it pointed at
    /// before; a second statement sees what is locked as it is.
    /// A node's partitions share the database: each takes its own users'
    /// (`herald_partition`, computed only for the rows already due).
    public func due(_ deadline: Deadline, until: Millis, limit: Int, in partition: Partition) throws(StoreError) -> [(UserKey, Notification)] {
        try check()
        guard limit > 0 else { return [] }
        let shared = partition.count > 1, column = deadline.column
        let due = try db.query("""
            SELECT n.app, n.user_id, n.id, f.head FROM notifications n
            JOIN feeds f ON f.app = n.app AND f.user_id = n.user_id
            WHERE n.\(column) <= $1 \(shared ? "AND herald_partition(n.app, n.user_id, $3) = $4" : "")
            ORDER BY n.\(column), n.app, n.user_id, n.id LIMIT $2
            FOR UPDATE OF n, f SKIP LOCKED
            """, [.int(until), .int(Int64(limit))] + (shared ? [.int(Int64(partition.count)), .int(Int64(partition.index))] : []))
        guard due.count > 0 else { return [] }
        var keys: [[String]] = [[], [], []]
        for i in 0..<due.count {
            guard let app = due.text(i, 0), let u = due.text(i, 1), let id = due.text(i, 2) else { throw reads.corrupt("notification") }
            keys[0].append(app); keys[1].append(u); keys[2].append(id)
            let user = UserKey(app: app, user: u)
            if inTransaction, heads[user] == nil { heads[user] = due.int64(i, 3) }
        }
        let r = try db.query(Self.dueSQL, keys.map(PostgresValue.textArray))
        let ns = try reads.notifications(r, 2)
        var out: [(UserKey, Notification)] = []
        for (i, n) in ns.enumerated() {
            guard let app = r.text(i, 0), let u = r.text(i, 1) else { throw reads.corrupt("notification") }
            out.append((UserKey(app: app, user: u), n))
        }
        return out
    }

    public func usersWithDevices(app: String) throws(StoreError) -> [(user: String, devices: [Device])] {
        try check()
        let r = try db.query("""
            SELECT user_id, \(PostgresReads.deviceColumns) FROM devices
            WHERE app = $1 ORDER BY user_id, registered
            """, [.text(app)])
        var out: [(user: String, devices: [Device])] = []
        for i in 0..<r.count {
            guard let u = r.text(i, 0) else { throw reads.corrupt("device") }
            let d = try reads.device(r, i, 1)
            if out.last?.user == u { out[out.count - 1].devices.append(d) } else { out.append((user: u, devices: [d])) }
        }
        return out
    }

    /// Other nodes, and this node's other partitions, write the same database.
    public var isShared: Bool { true }

    /// A reader on a second connection to the same database.
    public func makeReader() throws(StoreError) -> StoreReader? {
        try PostgresStoreReader(url: url, epoch: epoch)
    }

    // MARK: Writing notifications and their changes

    /// Assigns the user's next seq: `head + 1` of its feeds row, locked
    /// until the transaction ends (see the class comment), so no other node
    /// can move it meanwhile. The write that uses the seq stores it as the
    /// new head (`moveHead`). Inside a transaction only (`write`).
    private func nextSeq(_ user: UserKey) throws(StoreError) -> Int64 {
        try lock(user)
        guard let head = heads[user] else { throw db.error("seq", "outside a transaction") }
        heads[user] = head + 1
        return head + 1
    }

    /// The rest of every write statement, after its CTEs `old` (what the
    /// notification counted for before: read_state, seen_state,
    /// user_action_state, count_platforms, count_tags, and the seq of the
    /// change it points at; no row for a new one) and `new` (the same
    /// after; no row for a delete): appends the change (parameters $1...$13, and the
    /// notification's id $14), drops the change the notification pointed at
    /// if only that kept it (`pruneChanges`), makes the new seq ($3) the
    /// feed's head, and moves the user's counts by the difference. A counts
    /// row left at 0 is dropped by `pruneChanges`, so a write needs no
    /// statement after this one.
    private static let appendAndCount = """
        appended AS (
            INSERT INTO changes (app, user_id, seq, at, change, before_unread, before_platforms, before_tags, before_unseen,
                                 after_unread, after_platforms, after_tags, after_unseen, notification_id)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14)
        ), released AS (
            DELETE FROM changes WHERE app = $1 AND user_id = $2 AND seq = (SELECT seq FROM old) AND at IS NULL
        ), head AS (
            UPDATE feeds SET head = $3 WHERE app = $1 AND user_id = $2
        ), delta AS (
            SELECT count_platforms AS platforms, count_tags AS tags,
                   -(read_state = '\(ReadState.unread.rawValue)')::int AS unread,
                   -(seen_state = '\(SeenState.unseen.rawValue)')::int AS unseen,
                   -(user_action_state = '\(UserActionState.noInteraction.rawValue)')::int AS no_interaction,
                   -1 AS total
            FROM old
            UNION ALL
            SELECT count_platforms, count_tags, (read_state = '\(ReadState.unread.rawValue)')::int,
                   (seen_state = '\(SeenState.unseen.rawValue)')::int,
                   (user_action_state = '\(UserActionState.noInteraction.rawValue)')::int, 1
            FROM new
        ), counted AS (
            INSERT INTO counts (app, user_id, platforms, tags, unread, unseen, no_interaction, total)
            SELECT $1, $2, platforms, tags, sum(unread), sum(unseen), sum(no_interaction), sum(total) FROM delta
            GROUP BY platforms, tags
            HAVING sum(unread) <> 0 OR sum(unseen) <> 0 OR sum(no_interaction) <> 0 OR sum(total) <> 0
            ON CONFLICT (app, user_id, platforms, tags) DO UPDATE SET
                unread = counts.unread + excluded.unread, unseen = counts.unseen + excluded.unseen,
                no_interaction = counts.no_interaction + excluded.no_interaction,
                total = counts.total + excluded.total
        )
        SELECT 1
        """

    private static func appendParameters(_ user: UserKey, _ r: ChangeRecord) -> [PostgresValue] {
        func presence(_ p: Presence?) -> [PostgresValue] {
            guard let p else { return [.null, .null, .null, .null] }
            let c = StoredForm.columns(p.targeting)
            return [.bool(p.unread), c.platforms.map(PostgresValue.text) ?? .null, c.tags.map(PostgresValue.text) ?? .null,
                    .bool(p.unseen)]
        }
        return key(user) + [.int(r.seq), .int(r.at), .utf8(r.encoded[...])] + presence(r.before) + presence(r.after)
    }

    // The counts move by what was stored, not by the caller's `previous` or
    // `n`: they stay those of the live notifications whatever a caller passes.
    // One round trip per write: all parts of a statement read one snapshot,
    // so `old` is the row before the statement's own changes.

    public func upsert(_ user: UserKey, _ n: Notification, previous: Notification?, at: Millis) throws(StoreError) -> ChangeRecord {
        try write { () throws(StoreError) -> ChangeRecord in
            let seq = try nextSeq(user)
            let r = ChangeRecord(change: Change(seq: seq, op: .upsert(n)), before: previous.map(Presence.init),
                                 after: Presence(n), at: at)
            let key = TargetingKey(n.targeting)
            try db.send("""
                WITH old AS (
                    SELECT read_state, seen_state, user_action_state, count_platforms, count_tags, seq FROM notifications
                    WHERE app = $1 AND user_id = $2 AND id = $14
                ), new AS (
                    SELECT $18::text AS read_state, $23::text AS seen_state, $19::text AS user_action_state,
                           $21::text AS count_platforms, $22::text AS count_tags
                ), saved AS (
                    -- The JSON goes only into the change: written once (migration 3).
                    INSERT INTO notifications (app, user_id, id, app_notification_id, created_at, expires_at, read_state,
                                               user_action_state, version, count_platforms, count_tags, json, seq, seen_state,
                                               snoozed_until)
                    VALUES ($1, $2, $14, $15, $16, $17, $18, $19, $20, $21, $22, '', $3, $23, $24)
                    ON CONFLICT (app, user_id, id) DO UPDATE SET
                        app_notification_id = excluded.app_notification_id, created_at = excluded.created_at,
                        expires_at = excluded.expires_at, read_state = excluded.read_state, seen_state = excluded.seen_state,
                        user_action_state = excluded.user_action_state, version = excluded.version,
                        count_platforms = excluded.count_platforms, count_tags = excluded.count_tags, json = '',
                        seq = excluded.seq, snoozed_until = excluded.snoozed_until
                ), \(Self.appendAndCount)
                """, Self.appendParameters(user, r)
                    + [.text(n.id), .text(n.appNotificationId), .int(n.createdAt), .int(n.expiresAt),
                       .text(n.readState.rawValue), .text(n.userActionState.rawValue), .int(n.version),
                       .text(key.platforms), .text(key.tags), .text(n.seenState.rawValue),
                       n.snoozedUntil.map { .int($0) } ?? .null])
            remember(user, n)
            written[user, default: []].append(r)
            return r
        }
    }

    public func delete(_ user: UserKey, _ n: Notification, reason: DeleteReason, at: Millis) throws(StoreError) -> ChangeRecord {
        try write { () throws(StoreError) -> ChangeRecord in
            let seq = try nextSeq(user)
            let op = Change.Op.delete(id: n.id, appNotificationId: n.appNotificationId, reason: reason)
            let r = ChangeRecord(change: Change(seq: seq, op: op), before: Presence(n), after: nil, at: at)
            try db.send("""
                WITH old AS (
                    DELETE FROM notifications WHERE app = $1 AND user_id = $2 AND id = $14
                    RETURNING read_state, seen_state, user_action_state, count_platforms, count_tags, seq
                ), new AS (
                    SELECT * FROM old WHERE false
                ), \(Self.appendAndCount)
                """, Self.appendParameters(user, r) + [.text(n.id)])
            remember(user, n, deleted: true)
            written[user, default: []].append(r)
            return r
        }
    }

    public func savePreferences(_ user: UserKey, _ p: Preferences, at: Millis) throws(StoreError) -> ChangeRecord {
        try write { () throws(StoreError) -> ChangeRecord in
            let seq = try nextSeq(user)
            let r = ChangeRecord(change: Change(seq: seq, op: .preferences(p)), before: nil, after: nil, at: at)
            let saved = p.with(critical: [])
            try db.send("""
                WITH saved AS (
                    INSERT INTO preferences (app, user_id, preferences) VALUES ($1, $2, $15)
                    ON CONFLICT (app, user_id) DO UPDATE SET preferences = excluded.preferences
                ), old AS (
                    SELECT read_state, seen_state, user_action_state, count_platforms, count_tags, seq FROM notifications WHERE false
                ), new AS (
                    SELECT * FROM old
                ), \(Self.appendAndCount)
                """, Self.appendParameters(user, r) + [.null, .utf8(saved.json.encoded[...])])
            if inTransaction { knownPreferences[user] = saved }
            written[user, default: []].append(r)
            return r
        }
    }

    // MARK: Retention

    /// Drops, for every user, the changes up to the last one recorded before
    /// `before` and raises the feed's floor to it. A change a notification
    /// points at (it keeps its JSON only there) stays below the floor with
    /// `at` NULL, out of later passes, until the notification changes or
    /// goes (`appendAndCount`); so every change at or below a floor is kept
    /// that way, and a pass reads only those above. Users another
    /// transaction holds are skipped (pruned next time) rather than waited
    /// for, so the sweep never deadlocks with a batch. Also drops the counts
    /// rows that writes left at 0 (see `appendAndCount`), as skipping, every
    /// `countsSweepEvery` (it scans the table). A call may go past `limit`
    /// by changes of one user at one instant (up to that user's latest
    /// among the oldest `limit`).
    public func pruneChanges(before: Millis, limit: Int) throws(StoreError) -> Pruned {
        let limit = max(limit, 1)
        return try write { () throws(StoreError) -> Pruned in
            // Also when the clock went back. (A rolled-back sweep waits for the next.)
            if countsSweptAt.map({ before < $0 || before >= $0 + Self.countsSweepEvery }) ?? true {
                try db.execute("""
                    DELETE FROM counts WHERE ctid = ANY(ARRAY(SELECT ctid FROM counts WHERE total = 0 FOR UPDATE SKIP LOCKED))
                    """)
                countsSweptAt = before
            }
            // Locks first: a second statement then sees every write that
            // committed before the locks, so no change is taken for pointed
            // at after its notification moved on. The oldest `limit` changes
            // name the users of this call (kept changes have no `at`).
            let mine = try db.query("""
                WITH oldest AS (
                    SELECT app, user_id, seq FROM changes WHERE at < $1 ORDER BY at LIMIT $2
                ), cuts AS (
                    SELECT app, user_id, max(seq) AS seq FROM oldest GROUP BY app, user_id
                )
                SELECT f.app, f.user_id, f.floor, c.seq, (SELECT count(*) FROM oldest) FROM feeds f
                JOIN cuts c ON c.app = f.app AND c.user_id = f.user_id
                WHERE c.seq > f.floor
                FOR UPDATE OF f SKIP LOCKED
                """, [.int(before), .int(Int64(limit))])
            guard mine.count > 0 else { return Pruned(changes: 0, more: false) }
            let more = mine.int64(0, 4) >= Int64(limit)
            var columns: [[String]] = [[], [], [], []]
            for i in 0..<mine.count {
                for c in 0..<4 { columns[c].append(mine.text(i, Int32(c)) ?? "") }
            }
            let pruned = Int(try db.query("""
                WITH mine AS (
                    SELECT * FROM unnest($1::text[], $2::text[], $3::bigint[], $4::bigint[]) AS m(app, user_id, floor, seq)
                ), raised AS (
                    UPDATE feeds f SET floor = m.seq FROM mine m WHERE f.app = m.app AND f.user_id = m.user_id
                ), pruned AS (
                    SELECT c.app, c.user_id, c.seq, EXISTS (
                        SELECT 1 FROM notifications n WHERE n.app = c.app AND n.user_id = c.user_id
                                                        AND n.id = c.notification_id AND n.seq = c.seq) AS pointed
                    FROM changes c JOIN mine m ON c.app = m.app AND c.user_id = m.user_id AND c.seq > m.floor AND c.seq <= m.seq
                ), kept AS (
                    UPDATE changes c SET at = NULL FROM pruned p
                    WHERE p.pointed AND c.app = p.app AND c.user_id = p.user_id AND c.seq = p.seq
                ), gone AS (
                    DELETE FROM changes c USING pruned p
                    WHERE NOT p.pointed AND c.app = p.app AND c.user_id = p.user_id AND c.seq = p.seq
                )
                SELECT count(*) FROM pruned
                """, columns.map(PostgresValue.textArray)).int64(0, 0))
            return Pruned(changes: pruned, more: more)
        }
    }

    // MARK: Writing devices

    public func saveDevice(_ user: UserKey, _ device: Device) throws(StoreError) {
        try reading(user).db.send("""
            INSERT INTO devices (app, user_id, device_id, platform, tags, last_seen_at, view_generation, push, push_key)
            VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9)
            ON CONFLICT (app, user_id, device_id) DO UPDATE SET
                platform = excluded.platform, tags = excluded.tags, last_seen_at = excluded.last_seen_at,
                view_generation = excluded.view_generation, push = excluded.push, push_key = excluded.push_key
            """, Self.key(user) + [.text(device.deviceId), .text(device.platform.rawValue), .utf8(StoredForm.tags(device.tags)[...]),
                                   .int(device.lastSeenAt), .int(device.viewGeneration),
                                   device.push.map { .utf8($0.json.encoded[...]) } ?? .null, device.push.map { .text($0.key) } ?? .null])
    }

    public func deleteDevice(_ user: UserKey, id: String) throws(StoreError) -> Bool {
        try dropPushes(user, deviceId: id)
        return try reading(user).db.execute("DELETE FROM devices WHERE app = $1 AND user_id = $2 AND device_id = $3",
                                            Self.key(user) + [.text(id)]) > 0
    }

    public func pruneDevices(lastSeenBefore before: Millis) throws(StoreError) -> Int {
        try check()
        try db.send("DELETE FROM push_tap_spacing WHERE not_before < $1", [.int(before)])
        return try db.execute("DELETE FROM devices WHERE last_seen_at < $1", [.int(before)])
    }

    // MARK: Planner statistics

    public func refreshPlannerStatistics() throws(StoreError) -> [String] {
        guard !inTransaction else { throw db.error("statistics", "inside a transaction") }
        try check()
        return try reads.refreshPlannerStatistics()
    }
}

// MARK: Presence across nodes

/// Times are the database's (`now()`, the transaction's start), so the
/// nodes' clocks need not agree.
extension PostgresStore: ClusterDirectory {
    public func renewLease(node: String, millis: Int64) throws(StoreError) -> Bool {
        try check()
        try db.name("herald/" + node)
        let lease: [PostgresValue] = [.text(node), .int(millis)]
        if try db.execute("UPDATE herald_nodes SET lease_until = now() + $2 * interval '1 millisecond' WHERE node = $1", lease) > 0 {
            return true
        }
        try db.execute("INSERT INTO herald_nodes (node, lease_until) VALUES ($1, now() + $2 * interval '1 millisecond')", lease)
        return false
    }

    public func setConnection(node: String, _ user: UserKey, device: String, transport: String?, millis: Int64?) throws(StoreError) {
        try check()
        let key = Self.key(user) + [.text(device), .text(node)]
        guard let transport else {
            try db.send("DELETE FROM herald_connections WHERE app = $1 AND user_id = $2 AND device_id = $3 AND node = $4", key)
            return
        }
        try db.send("""
            INSERT INTO herald_connections (app, user_id, device_id, node, transport, until)
            VALUES ($1, $2, $3, $4, $5, now() + $6::bigint * interval '1 millisecond')
            ON CONFLICT (app, user_id, device_id, node) DO UPDATE SET transport = excluded.transport, until = excluded.until
            """, key + [.text(transport), millis.map(PostgresValue.int) ?? .null])
    }

    public func connections(_ user: UserKey, otherThan node: String) throws(StoreError) -> [(device: String, transport: String)] {
        try check()
        let r = try db.query("""
            SELECT c.device_id, c.transport FROM \(PostgresReads.liveConnections)
              AND c.app = $1 AND c.user_id = $2 AND c.node <> $3
            """, Self.key(user) + [.text(node)])
        return try (0..<r.count).map { i throws(StoreError) in
            guard let d = r.text(i, 0), let t = r.text(i, 1) else { throw reads.corrupt("connection") }
            return (d, t)
        }
    }

    public func pruneConnections(node: String) throws(StoreError) {
        try check()
        try db.execute("""
            WITH gone AS (DELETE FROM herald_nodes WHERE lease_until < now() - interval '1 minute' RETURNING node)
            DELETE FROM herald_connections WHERE node IN (SELECT node FROM gone) OR (node = $1 AND until < now())
            """, [.text(node)])
    }

    public func retire(node: String) throws(StoreError) {
        try check()
        try db.execute("DELETE FROM herald_connections WHERE node = $1", [.text(node)])
        try db.execute("DELETE FROM herald_nodes WHERE node = $1", [.text(node)])
    }
}

// MARK: The push outbox
extension PostgresStore {
    static let pushOutbox = OutboxSQL.postgres("push_outbox", returning: "id, app, user_id, device_id, message, committed_at, attempts, generation")

    @discardableResult
    public func enqueuePush(_ user: UserKey, deviceId: String, _ message: PushMessage, at: Millis,
                            claimUntil: Millis?) throws(StoreError) -> PushJob? {
        try check()
        let values = Self.key(user) + [.text(deviceId), .text(message.kind.rawValue), .utf8(message.json.encoded[...]), .int(at),
                                       .int(claimUntil ?? 0)]
        let sql = """
            INSERT INTO push_outbox (app, user_id, device_id, kind, message, committed_at, due_at, claimed_until)
            SELECT $1::text, $2::text, $3::text, $4::text, $5::text, $6::bigint, due,
                   CASE WHEN due = $6::bigint THEN $7::bigint ELSE 0 END
            FROM (SELECT greatest($6::bigint, (SELECT not_before FROM push_tap_spacing
                                               WHERE $4::text = 'tap' AND app = $1 AND user_id = $2 AND device_id = $3)) AS due) d
            ON CONFLICT (app, user_id, device_id) WHERE kind = 'tap' DO UPDATE SET
                message = excluded.message, generation = push_outbox.generation + 1
            """
        // Without a claim nothing is read back: the statement joins the pipeline.
        guard claimUntil != nil else {
            try db.send(sql, values)
            return nil
        }
        // A new row has generation 0; a tap joined to one there has more.
        let r = try db.query(sql + " RETURNING id, generation, claimed_until", values)
        guard r.count > 0, r.int64(0, 1) == 0, r.int64(0, 2) != 0 else { return nil }
        return PushJob(id: r.int64(0, 0), user: user, deviceId: deviceId, message: message, committedAt: at)
    }

    public func claimPushes(now: Millis, until: Millis, limit: Int) throws(StoreError) -> [PushJob] {
        try check()
        // SKIP LOCKED: rows another node is claiming at this moment are
        // left to it; claimed_until keeps them from everyone once it commits.
        let r = try db.query(Self.pushOutbox.claim(), [.int(until), .int(now), .int(Int64(limit))])
        var out: [PushJob] = []
        for i in 0..<r.count {
            guard let app = r.text(i, 1), let u = r.text(i, 2), let d = r.text(i, 3),
                  let m = r.json(i, 4).flatMap(PushMessage.init(json:)) else { throw reads.corrupt("push") }
            out.append(PushJob(id: r.int64(i, 0), user: UserKey(app: app, user: u), deviceId: d, message: m,
                               committedAt: r.int64(i, 5), attempts: Int(r.int64(i, 6)), generation: r.int64(i, 7)))
        }
        return out.sorted { $0.id < $1.id }
    }

    public func finishPush(_ job: PushJob) throws(StoreError) {
        try check()
        try db.send("""
            WITH gone AS (DELETE FROM push_outbox WHERE id = $1 AND generation = $2 RETURNING id)
            UPDATE push_outbox SET claimed_until = 0, due_at = least(due_at, committed_at)
            WHERE id = $1 AND NOT EXISTS (SELECT 1 FROM gone)
            """, [.int(job.id), .int(job.generation)])
    }

    public func retryPush(_ job: PushJob, at: Millis) throws(StoreError) {
        try check()
        try db.send(Self.pushOutbox.retry, [.int(at), .int(Int64(job.attempts + 1)), .int(job.id)])
    }

    public func spaceTaps(_ user: UserKey, deviceId: String, until: Millis) throws(StoreError) {
        try check()
        let args = Self.key(user) + [.text(deviceId), .int(until)]
        try db.send("""
            INSERT INTO push_tap_spacing (app, user_id, device_id, not_before) VALUES ($1, $2, $3, $4)
            ON CONFLICT (app, user_id, device_id) DO UPDATE SET not_before = excluded.not_before
            """, args)
        try db.send("UPDATE push_outbox SET due_at = greatest(due_at, $4) WHERE app = $1 AND user_id = $2 AND device_id = $3 AND kind = 'tap'",
                    args)
    }

    public func dropPushes(_ user: UserKey, deviceId: String) throws(StoreError) {
        try check()
        try db.send("DELETE FROM push_outbox WHERE app = $1 AND user_id = $2 AND device_id = $3", Self.key(user) + [.text(deviceId)])
    }

    /// Inside a transaction, also locks the holder's user, which the caller
    /// is about to write (the handle moves). Its claim locked the holder it
    /// found then (`.pushHolder`); one that took the handle since is locked
    /// `NOWAIT`, out of the shared order, so it must not wait: a refusal is
    /// a conflict, and the batch runs again, its claim finding the new holder.
    public func pushHolder(app: String, key: String) throws(StoreError) -> (user: String, deviceId: String)? {
        try check()
        while true {
            let r = try db.query("SELECT user_id, device_id FROM devices WHERE app = $1 AND push_key = $2", [.text(app), .text(key)])
            guard r.count > 0, let u = r.text(0, 0), let d = r.text(0, 1) else { return nil }
            let user = UserKey(app: app, user: u)
            guard inTransaction, heads[user] == nil else { return (u, d) }
            // Locked, the holder may have let the handle go: read it again.
            try lockWithoutWaiting(user)
        }
    }

    /// `lock`, refusing to wait for another transaction holding the row.
    private func lockWithoutWaiting(_ user: UserKey) throws(StoreError) {
        let r: PostgresRows
        do {
            r = try db.query("SELECT head FROM feeds WHERE app = $1 AND user_id = $2 FOR UPDATE NOWAIT", Self.key(user))
        } catch {
            // A refusal, not a lock wait that ran out (no node to fence).
            db.lockWaitRanOut = false
            throw error
        }
        guard r.count == 1 else { return try lock(user) }  // no row: none to wait for, but one to create
        heads[user] = r.int64(0, 0)
    }

    public func pendingPushes() throws(StoreError) -> Int { try outboxSize("push_outbox_size") }

    public func pendingPushes(_ user: UserKey) throws(StoreError) -> [String: Int] {
        try check()
        let r = try db.query("SELECT device_id, count(*) FROM push_outbox WHERE app = $1 AND user_id = $2 GROUP BY device_id", Self.key(user))
        var out: [String: Int] = [:]
        for i in 0..<r.count {
            guard let d = r.text(i, 0) else { throw reads.corrupt("push outbox row") }
            out[d] = Int(r.int64(i, 1))
        }
        return out
    }

    /// The length of the outbox whose size table is `table` (migrations 9
    /// and 13): one row per session that wrote it.
    private func outboxSize(_ table: String) throws(StoreError) -> Int {
        try check()
        // The rows of sessions that ended fold into row 0, so the table stays
        // as long as the sessions writing (SKIP LOCKED, row 0 too: a node
        // folding while another does skips it rather than wait inside its
        // claim). The sum is read from the statement's snapshot, before the
        // fold, which moves no total.
        return Int(try db.query("""
            WITH zero AS (
                SELECT writer FROM \(table) WHERE writer = 0 FOR UPDATE SKIP LOCKED
            ), ended AS (
                DELETE FROM \(table) WHERE EXISTS (SELECT 1 FROM zero) AND writer IN (
                    SELECT writer FROM \(table) s
                    WHERE writer <> 0 AND NOT EXISTS (SELECT 1 FROM pg_stat_activity a WHERE a.pid = s.writer)
                    FOR UPDATE SKIP LOCKED)
                RETURNING pushes
            ), folded AS (
                UPDATE \(table) SET pushes = pushes + (SELECT sum(pushes) FROM ended)
                WHERE writer = 0 AND EXISTS (SELECT 1 FROM ended)
            )
            SELECT coalesce(sum(pushes), 0)::bigint FROM \(table)
            """).int64(0, 0))
    }

    public func sharedToken(_ name: String) throws(StoreError) -> SharedToken? {
        try check()
        let r = try db.query("SELECT value, issued_at FROM shared_tokens WHERE name = $1", [.text(name)])
        guard r.count > 0 else { return nil }
        guard let v = r.text(0, 0) else { throw reads.corrupt("shared token") }
        return SharedToken(value: v, issuedAt: r.int64(0, 1))
    }

    /// Under READ COMMITTED an UPDATE that waited for another's renewal
    /// sees the row it committed, whose issued_at no longer matches.
    public func replaceSharedToken(_ name: String, with token: SharedToken, replacing: Millis?) throws(StoreError) -> Bool {
        try check()
        guard let replacing else {
            return try db.execute("INSERT INTO shared_tokens (name, value, issued_at) VALUES ($1, $2, $3) ON CONFLICT (name) DO NOTHING",
                                  [.text(name), .text(token.value), .int(token.issuedAt)]) == 1
        }
        return try db.execute("UPDATE shared_tokens SET value = $2, issued_at = $3 WHERE name = $1 AND issued_at = $4",
                              [.text(name), .text(token.value), .int(token.issuedAt), .int(replacing)]) == 1
    }
}

// MARK: The webhook outbox
extension PostgresStore {
    static let webhookOutbox = OutboxSQL.postgres("webhook_outbox", returning: OutboxSQL.webhookColumns)

    public func enqueueWebhook(app: String, url: String, eventId: String, body: [UInt8], at: Millis) throws(StoreError) {
        try check()
        try db.send(Self.webhookOutbox.insertWebhook, [.text(app), .text(url), .text(eventId), .utf8(body[...]), .int(at)])
    }

    public func claimWebhooks(app: String, url: String, now: Millis, until: Millis, limit: Int) throws(StoreError) -> [WebhookJob] {
        try check()
        let r = try db.query(Self.webhookOutbox.claimWebhooks, [.int(until), .int(now), .int(Int64(limit)), .text(app), .text(url)])
        var out: [WebhookJob] = []
        for i in 0..<r.count {
            guard let job = OutboxSQL.webhookJob(text: { r.text(i, $0) }, bytes: { r.bytes(i, $0) }, int: { r.int64(i, $0) }) else {
                throw reads.corrupt("webhook")
            }
            out.append(job)
        }
        return out.sorted { $0.id < $1.id }
    }

    public func retryWebhook(_ job: WebhookJob, at: Millis, attempted: Bool) throws(StoreError) {
        try check()
        try db.send(Self.webhookOutbox.retry, [.int(at), .int(Int64(job.attempts + (attempted ? 1 : 0))), .int(job.id)])
    }

    public func dropWebhooks(committedBefore before: Millis, limit: Int) throws(StoreError) -> Int {
        try check()
        return try db.execute(Self.webhookOutbox.dropOlder, [.int(before), .int(Int64(limit))])
    }

    public func finishWebhook(_ job: WebhookJob) throws(StoreError) {
        try check()
        try db.send(Self.webhookOutbox.delete, [.int(job.id)])
    }

    public func pendingWebhooks() throws(StoreError) -> Int { try outboxSize("webhook_outbox_size") }

    public func pendingWebhooks(app: String, url: String, upTo limit: Int) throws(StoreError) -> Int {
        try check()
        return Int(try db.query("SELECT count(*) FROM (SELECT 1 FROM webhook_outbox WHERE app = $1 AND url = $2 LIMIT $3) AS p",
                                [.text(app), .text(url), .int(Int64(limit))]).int64(0, 0))
    }
}
