import HeraldCore

/// Every per-user query of a Herald PostgreSQL database that only reads, on
/// one connection: the store runs them on its own connection, a
/// `PostgresStoreReader` on its second one.
struct PostgresReads {
    let db: PostgresConnection

    func corrupt(_ what: String) -> StoreError {
        StoreError("postgres (\(db.name)): unreadable \(what) in the database (damaged?)")
    }

    private func key(_ user: UserKey) -> [PostgresValue] { [.text(user.app), .text(user.user)] }

    func feed(_ user: UserKey) throws(StoreError) -> FeedState {
        let r = try db.query("SELECT head, floor FROM feeds WHERE app = $1 AND user_id = $2", key(user))
        return r.count == 0 ? FeedState() : FeedState(head: r.int64(0, 0), floor: r.int64(0, 1))
    }

    /// `users` as two text[] parameters, apps and user ids.
    static func userArrays<C: Collection<UserKey>>(_ users: C) -> [PostgresValue] {
        [.textArray(users.map(\.app)), .textArray(users.map(\.user))]
    }

    /// Users a statement, for the reads and locks that take arrays of users.
    static let chunk = 500

    /// `items` in parts of at most `chunk`.
    static func chunked<T>(_ items: [T]) -> [ArraySlice<T>] {
        stride(from: 0, to: items.count, by: chunk).map { items[$0..<min($0 + chunk, items.count)] }
    }

    /// `SELECT f.app, f.user_id, <select>` for the users of two text[]
    /// parameters (`select` names its table `f`; `rest`: a WHERE, an ORDER BY).
    private static func forUsers(_ select: String, _ rest: String = "") -> String {
        """
        SELECT f.app, f.user_id, \(select) JOIN unnest($1::text[], $2::text[]) AS u(app, user_id)
        ON f.app = u.app AND f.user_id = u.user_id \(rest)
        """
    }

    static let headsSQL = forUsers("f.head FROM feeds f")

    /// `IS NOT NULL` lets the wake index (of only the rows with a time) serve it.
    func next(_ deadline: Deadline) throws(StoreError) -> Millis? {
        let c = deadline.column
        let r = try db.query("SELECT min(\(c)) FROM notifications WHERE \(c) IS NOT NULL")
        return r.count == 0 ? nil : r.optionalInt64(0, 0)
    }
    private static let devicesSQL = forUsers("\(deviceColumns) FROM devices f", "ORDER BY f.registered")
    private static let pushDevicesSQL = forUsers("\(deviceColumns) FROM devices f", "WHERE f.push IS NOT NULL ORDER BY f.registered")

    /// Feed heads, `chunk` users a statement.
    func heads(_ users: [UserKey]) throws(StoreError) -> [UserKey: Int64] {
        var out: [UserKey: Int64] = [:]
        for part in Self.chunked(users) { try addHeads(db.query(Self.headsSQL, Self.userArrays(part)), to: &out) }
        return out
    }

    /// Adds the heads `headsSQL` read.
    func addHeads(_ r: PostgresRows, to out: inout [UserKey: Int64]) throws(StoreError) {
        try forEachUser(r, "feed") { user, i throws(StoreError) in out[user] = r.int64(i, 2) }
    }

    /// Device registrations, `chunk` users a statement, each user's in registration order.
    func devices(of users: [UserKey]) throws(StoreError) -> [UserKey: [Device]] { try devices(of: users, Self.devicesSQL) }
    func pushDevices(of users: [UserKey]) throws(StoreError) -> [UserKey: [Device]] { try devices(of: users, Self.pushDevicesSQL) }

    private func devices(of users: [UserKey], _ sql: String) throws(StoreError) -> [UserKey: [Device]] {
        var out: [UserKey: [Device]] = [:]
        for part in Self.chunked(users) {
            let r = try db.query(sql, Self.userArrays(part))
            try forEachUser(r, "device") { user, i throws(StoreError) in out[user, default: []].append(try device(r, i, 2)) }
        }
        return out
    }

    /// Each row of a `forUsers` statement with its user.
    private func forEachUser(_ r: PostgresRows, _ what: String, _ body: (UserKey, Int) throws(StoreError) -> Void) throws(StoreError) {
        for i in 0..<r.count {
            guard let app = r.text(i, 0), let user = r.text(i, 1) else { throw corrupt(what) }
            try body(UserKey(app: app, user: user), i)
        }
    }

    /// A stored notification's columns, as `notifications` decodes them:
    /// its own JSON, or the seq of the change holding it and that change.
    static let storedNotification = "n.json, n.seq, c.change"
    static let notificationsWithChanges = """
        notifications n LEFT JOIN changes c ON c.app = n.app AND c.user_id = n.user_id AND c.seq = n.seq
        """
    private static let byIdSQL = """
        SELECT \(storedNotification) FROM \(notificationsWithChanges) WHERE n.app = $1 AND n.user_id = $2 AND n.id = $3
        """
    private static let byAppIdSQL = """
        SELECT \(storedNotification) FROM \(notificationsWithChanges)
        WHERE n.app = $1 AND n.user_id = $2 AND n.app_notification_id = $3
        """
    private static let historyFirstSQL = """
        SELECT \(storedNotification) FROM \(notificationsWithChanges) WHERE n.app = $1 AND n.user_id = $2
        ORDER BY n.created_at DESC, n.id DESC LIMIT $3
        """
    private static let historyAfterSQL = """
        SELECT \(storedNotification) FROM \(notificationsWithChanges)
        WHERE n.app = $1 AND n.user_id = $2 AND (n.created_at, n.id) < ($3, $4)
        ORDER BY n.created_at DESC, n.id DESC LIMIT $5
        """

    /// Decodes `storedNotification`'s columns from `col` of every row.
    func notifications(_ r: PostgresRows, _ col: Int32 = 0) throws(StoreError) -> [Notification] {
        var out: [Notification] = []
        for i in 0..<r.count {
            guard let n = StoredForm.notification(json: r.buffer(i, col), seq: r.optionalInt64(i, col + 1),
                                                  change: r.buffer(i, col + 2))
            else { throw corrupt("notification") }
            out.append(n)
        }
        return out
    }

    func notification(_ user: UserKey, id: String) throws(StoreError) -> Notification? {
        try notifications(db.query(Self.byIdSQL, key(user) + [.text(id)])).first
    }

    func notification(_ user: UserKey, appNotificationId: String) throws(StoreError) -> Notification? {
        try notifications(db.query(Self.byAppIdSQL, key(user) + [.text(appNotificationId)])).first
    }

    /// Never below the floor, where only changes still pointed at remain.
    func changes(_ user: UserKey, after: Int64, limit: Int) throws(StoreError) -> [ChangeRecord] {
        guard limit > 0 else { return [] }
        let r = try db.query("""
            SELECT seq, at, change, before_unread, before_platforms, before_tags, after_unread, after_platforms, after_tags,
                   before_unseen, after_unseen
            FROM changes WHERE app = $1 AND user_id = $2
              AND seq > greatest($3, coalesce((SELECT floor FROM feeds WHERE app = $1 AND user_id = $2), 0))
            ORDER BY seq LIMIT $4
            """, key(user) + [.int(after), .int(Int64(limit))])
        var out: [ChangeRecord] = []
        for i in 0..<r.count {
            let seq = r.int64(i, 0)
            guard let json = r.json(i, 2), let change = Change(json: json), change.seq == seq else {
                throw corrupt("change \(seq) of \(user)")
            }
            let before = try StoredForm.presence(unread: r.bool(i, 3), unseen: r.bool(i, 9), platforms: r.text(i, 4),
                                                 tags: r.text(i, 5), corrupt)
            let after = try StoredForm.presence(unread: r.bool(i, 6), unseen: r.bool(i, 10), platforms: r.text(i, 7),
                                                tags: r.text(i, 8), corrupt)
            out.append(StoredForm.record(change, json: json, before: before, after: after, at: r.int64(i, 1)) { r.bytes(i, 2) })
        }
        return out
    }

    /// Keyset pagination in history order; ids compare as bytes (COLLATE "C").
    func history(_ user: UserKey, after: HistoryKey?, limit: Int) throws(StoreError) -> [Notification] {
        guard limit > 0 else { return [] }
        guard let after else {
            return try notifications(db.query(Self.historyFirstSQL, key(user) + [.int(Int64(limit))]))
        }
        return try notifications(db.query(Self.historyAfterSQL, key(user) + [.int(after.createdAt), .text(after.id), .int(Int64(limit))]))
    }

    func counts(_ user: UserKey) throws(StoreError) -> [TargetingCounts] {
        let r = try db.query("""
            SELECT platforms, tags, unread, no_interaction, total, unseen FROM counts WHERE app = $1 AND user_id = $2 AND total > 0
            """, key(user))
        var out: [TargetingCounts] = []
        for i in 0..<r.count {
            guard let platforms = r.text(i, 0), let tags = r.text(i, 1),
                  let targeting = TargetingKey(platforms: platforms, tags: tags).targeting
            else { throw corrupt("counts of \(user)") }
            out.append(TargetingCounts(targeting: targeting, unread: Int(r.int64(i, 2)), unseen: Int(r.int64(i, 5)),
                                       noInteraction: Int(r.int64(i, 3)), total: Int(r.int64(i, 4))))
        }
        return out
    }

    /// A device's columns, as `device` decodes them.
    static let deviceColumns = "device_id, platform, tags, last_seen_at, view_generation, push"

    /// Decodes columns `col...col+5`, `deviceColumns`.
    func device(_ r: PostgresRows, _ i: Int, _ col: Int32) throws(StoreError) -> Device {
        guard let id = r.text(i, col), let platform = r.text(i, col + 1).flatMap(Platform.init(rawValue:)),
              let tags = StoredForm.tags(r.json(i, col + 2))
        else { throw corrupt("device") }
        return Device(deviceId: id, platform: platform, tags: tags, lastSeenAt: r.int64(i, col + 3),
                      viewGeneration: r.int64(i, col + 4),
                      push: try StoredForm.push(r.json(i, col + 5), isNull: r.isNull(i, col + 5), corrupt))
    }

    func preferences(_ user: UserKey) throws(StoreError) -> Preferences {
        let r = try db.query("SELECT preferences FROM preferences WHERE app = $1 AND user_id = $2", key(user))
        guard r.count > 0 else { return .unsaved }
        guard let p = r.json(0, 0).flatMap(Preferences.init(json:)) else { throw corrupt("preferences of \(user)") }
        return p
    }

    func devices(_ user: UserKey) throws(StoreError) -> [Device] {
        let r = try db.query("""
            SELECT \(Self.deviceColumns) FROM devices
            WHERE app = $1 AND user_id = $2 ORDER BY registered
            """, key(user))
        var out: [Device] = []
        for i in 0..<r.count { out.append(try device(r, i, 0)) }
        return out
    }

    /// Presence records (`herald_connections c`, `herald_nodes n`) that
    /// count: their node's lease runs and, for a poll, its minute has not
    /// ended. The one definition, for the listings and the inspector.
    static let liveConnections = """
        herald_connections c JOIN herald_nodes n ON n.node = c.node
        WHERE n.lease_until > now() AND (c.until IS NULL OR c.until > now())
        """

    /// `PresenceReading.connectedDevices`.
    func connectedDevices(app: String) throws(StoreError) -> [(node: String, transport: String, devices: Int)] {
        let r = try db.query("""
            SELECT c.node, c.transport, count(*) FROM \(Self.liveConnections) AND c.app = $1
            GROUP BY c.node, c.transport ORDER BY c.node, c.transport
            """, [.text(app)])
        return try (0..<r.count).map { i throws(StoreError) in
            guard let node = r.text(i, 0), let t = r.text(i, 1) else { throw corrupt("connection") }
            return (node, t, Int(r.int64(i, 2)))
        }
    }

    /// The tables whose statistics the hot statements' plans rest on.
    static let plannedTables = ["changes", "counts", "devices", "feeds", "herald_connections", "notifications"]
    /// A table of fewer rows than this is never analyzed here.
    static let statisticsFloor: Int64 = 1_000

    /// Analyzes the tables this role owns that hold more than twice the
    /// rows of their last ANALYZE (and over `statisticsFloor`), or were
    /// never analyzed: rows updated in place (a feed's head, counts) leave
    /// the plans as good as they were. Answers the tables analyzed.
    ///
    /// The statements are prepared once per session and PostgreSQL keeps a
    /// generic plan made from the statistics of that moment; made on a new,
    /// still empty database (autovacuum first analyzes a table up to a
    /// minute after it fills, `autovacuum_naptime`), it hash-joined whole
    /// tables for every batch's lookups: PostgreSQL's CPU per publish
    /// doubled (docs/BENCHMARKS-HISTORY.md, "Round four"). An ANALYZE makes every
    /// node plan its statements again. Afterwards autovacuum, analyzing at
    /// 10 % of changed rows, keeps ahead of this rule.
    func refreshPlannerStatistics() throws(StoreError) -> [String] {
        let grown = try db.query("""
            SELECT s.relname, clock_timestamp() FROM pg_stat_user_tables s JOIN pg_class c ON c.oid = s.relid
            WHERE s.schemaname = current_schema() AND s.relname = ANY($1::text[]) AND pg_has_role(c.relowner, 'USAGE')
              AND s.n_live_tup > greatest($2::bigint, 2 * c.reltuples)
            ORDER BY s.relname
            """, [.textArray(Self.plannedTables), .int(Self.statisticsFloor)])
        guard grown.count > 0, let began = grown.text(0, 1) else { return [] }
        var due: [String] = []
        for i in 0..<grown.count {
            guard let table = grown.text(i, 0), Self.plannedTables.contains(table) else { continue }
            // Skipped (only a warning) while another session holds it:
            // autovacuum or another node analyzing it, which does as well.
            try db.script("ANALYZE (SKIP_LOCKED) \(table)")
            due.append(table)
        }
        let analyzed = try db.query("""
            SELECT relname FROM pg_stat_user_tables
            WHERE schemaname = current_schema() AND relname = ANY($1::text[]) AND last_analyze >= $2::timestamptz
            ORDER BY relname
            """, [.textArray(due), .text(began)])
        return (0..<analyzed.count).compactMap { analyzed.text($0, 0) }
    }
}

/// A second connection to a store's database, for one thread other than
/// the owner's. `read` runs in one REPEATABLE READ transaction: one snapshot
/// of what had committed when it began. Reconnects by itself after a lost
/// connection, at the next call outside `read`.
final class PostgresStoreReader: StoreReader, PresenceReading {
    let epoch: String
    private let reads: PostgresReads

    init(url: String, epoch: String) throws(StoreError) {
        self.epoch = epoch
        reads = PostgresReads(db: try PostgresConnection(url: url, boundsLockWaits: false))
    }

    /// Outside `read`: connect again if the last call lost the connection.
    private func ready() throws(StoreError) -> PostgresReads {
        if !reads.db.inTransaction { try reads.db.reconnectIfLost() }
        return reads
    }

    func read<T>(_ body: (StoreReading) throws(StoreError) -> T) throws(StoreError) -> T {
        let db = try ready().db
        // Nested: the outer snapshot serves it.
        guard !db.inTransaction else { return try body(self) }
        // The snapshot is taken at the first statement, not at BEGIN: take it
        // now. A connection the server dropped while it idled is replaced
        // here; else the first catch-up after a restart failed and ended its
        // WebSocket.
        try db.begin("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY; SELECT 1")
        do throws(StoreError) {
            let r = try body(self)
            try db.script("COMMIT")
            return r
        } catch {
            if db.inTransaction { _ = try? db.script("ROLLBACK") }
            throw error
        }
    }

    func feed(_ user: UserKey) throws(StoreError) -> FeedState { try ready().feed(user) }
    func heads(_ users: [UserKey]) throws(StoreError) -> [UserKey: Int64] { try ready().heads(users) }
    func devices(of users: [UserKey]) throws(StoreError) -> [UserKey: [Device]] { try ready().devices(of: users) }
    func pushDevices(of users: [UserKey]) throws(StoreError) -> [UserKey: [Device]] { try ready().pushDevices(of: users) }
    func notification(_ user: UserKey, id: String) throws(StoreError) -> Notification? { try ready().notification(user, id: id) }
    func changes(_ user: UserKey, after: Int64, limit: Int) throws(StoreError) -> [ChangeRecord] {
        try ready().changes(user, after: after, limit: limit)
    }
    func history(_ user: UserKey, after: HistoryKey?, limit: Int) throws(StoreError) -> [Notification] {
        try ready().history(user, after: after, limit: limit)
    }
    func counts(_ user: UserKey) throws(StoreError) -> [TargetingCounts] { try ready().counts(user) }
    func preferences(_ user: UserKey) throws(StoreError) -> Preferences { try ready().preferences(user) }
    func devices(_ user: UserKey) throws(StoreError) -> [Device] { try ready().devices(user) }
    func next(_ deadline: Deadline) throws(StoreError) -> Millis? { try ready().next(deadline) }
    func connectedDevices(app: String) throws(StoreError) -> [(node: String, transport: String, devices: Int)] {
        try ready().connectedDevices(app: app)
    }
    /// Outside `read` (ANALYZE refuses a read-only transaction).
    func refreshPlannerStatistics() throws(StoreError) -> [String] {
        guard !reads.db.inTransaction else { throw reads.db.error("statistics", "inside a read") }
        return try ready().refreshPlannerStatistics()
    }
}
