import HeraldCore

/// Every query of a Herald database that only reads, on one connection: the
/// store runs them on its own connection, a `SQLiteStoreReader` on its
/// read-only one, so both read with one implementation.
struct SQLiteReads {
    let db: SQLiteDatabase

    func corrupt(_ what: String) -> StoreError {
        StoreError("sqlite (\(db.path)): unreadable \(what) in the database (damaged?)")
    }

    // MARK: Feeds and notifications

    func feed(_ user: UserKey) throws(StoreError) -> FeedState {
        var f = FeedState()
        try db.query("SELECT head, floor FROM feeds WHERE app = ? AND user = ?", [.text(user.app), .text(user.user)]) { r throws(StoreError) in
            f = FeedState(head: r.int64(0), floor: r.int64(1))
            return false
        }
        return f
    }

    /// Decodes `SQLiteStore.storedNotification`'s columns from `col`: the
    /// row's own JSON, or the part of the change it points at that holds it.
    private func notification(_ r: SQLiteRow, _ col: Int32) throws(StoreError) -> Notification {
        guard let n = StoredForm.notification(json: r.buffer(col), seq: r.optionalInt64(col + 1), change: r.buffer(col + 2))
        else { throw corrupt("notification") }
        return n
    }

    private func notifications(_ sql: String, _ args: [SQLiteValue], limit: Int = Int.max) throws(StoreError) -> [Notification] {
        var out: [Notification] = []
        try db.query(sql, args) { r throws(StoreError) in
            out.append(try notification(r, 0))
            return out.count < limit
        }
        return out
    }

    func notification(_ user: UserKey, id: String) throws(StoreError) -> Notification? {
        try notifications(SQLiteStore.notificationByIdSQL, [.text(user.app), .text(user.user), .text(id)], limit: 1).first
    }

    func notification(_ user: UserKey, appNotificationId: String) throws(StoreError) -> Notification? {
        try notifications(SQLiteStore.notificationByAppIdSQL, [.text(user.app), .text(user.user), .text(appNotificationId)], limit: 1).first
    }

    // MARK: The feed, history and counts

    /// `col`: its unread, platforms and tags columns; `unseen`: its unseen column.
    private func presence(_ r: SQLiteRow, _ col: Int32, unseen: Int32) throws(StoreError) -> Presence? {
        try StoredForm.presence(unread: r.optionalInt64(col).map { $0 != 0 }, unseen: r.optionalInt64(unseen).map { $0 != 0 },
                                platforms: r.text(col + 1), tags: r.text(col + 2), corrupt)
    }

    func changes(_ user: UserKey, after: Int64, limit: Int) throws(StoreError) -> [ChangeRecord] {
        guard limit > 0 else { return [] }
        var out: [ChangeRecord] = []
        var failure: StoreError?
        try db.query(SQLiteStore.changesAfterSQL, [.text(user.app), .text(user.user), .int(after), .int(Int64(limit))]) { r throws(StoreError) in
            let seq = r.int64(0)
            guard let json = r.json(2), let change = Change(json: json), change.seq == seq else {
                failure = corrupt("change \(seq) of \(user)")
                return false
            }
            do throws(StoreError) {
                out.append(StoredForm.record(change, json: json, before: try presence(r, 3, unseen: 9),
                                             after: try presence(r, 6, unseen: 10), at: r.int64(1)) { r.bytes(2) })
            } catch {
                failure = error
                return false
            }
            return true
        }
        if let failure { throw failure }
        return out
    }

    func history(_ user: UserKey, after: HistoryKey?, limit: Int) throws(StoreError) -> [Notification] {
        guard limit > 0 else { return [] }
        let base: [SQLiteValue] = [.text(user.app), .text(user.user)]
        guard let after else {
            return try notifications(SQLiteStore.historyFirstSQL, base + [.int(Int64(limit))])
        }
        return try notifications(SQLiteStore.historyAfterSQL,
                                 base + [.text(NotificationID.above(millisecond: after.createdAt)), .int(after.createdAt),
                                         .text(after.id), .int(Int64(limit))])
    }

    func counts(_ user: UserKey) throws(StoreError) -> [TargetingCounts] {
        var out: [TargetingCounts] = []
        try db.query(SQLiteStore.countsSQL, [.text(user.app), .text(user.user)]) { r throws(StoreError) in
            guard let platforms = r.text(0), let tags = r.text(1),
                  let targeting = TargetingKey(platforms: platforms, tags: tags).targeting
            else { throw corrupt("counts of \(user)") }
            out.append(TargetingCounts(targeting: targeting, unread: Int(r.int64(2)), unseen: Int(r.int64(5)),
                                       noInteraction: Int(r.int64(3)), total: Int(r.int64(4))))
            return true
        }
        return out
    }

    func next(_ deadline: Deadline) throws(StoreError) -> Millis? {
        var at: Millis?
        try db.query(SQLiteStore.nextSQL(deadline)) { r throws(StoreError) in
            at = r.isNull(0) ? nil : r.int64(0)
            return false
        }
        return at
    }

    func due(_ deadline: Deadline, until: Millis, limit: Int) throws(StoreError) -> [(UserKey, Notification)] {
        guard limit > 0 else { return [] }
        var out: [(UserKey, Notification)] = []
        try db.query(SQLiteStore.dueSQL(deadline), [.int(until), .int(Int64(limit))]) { r throws(StoreError) in
            guard let app = r.text(0), let u = r.text(1) else { throw corrupt("notification") }
            out.append((UserKey(app: app, user: u), try notification(r, 2)))
            return true
        }
        return out
    }

    // MARK: Devices

    private func device(_ r: SQLiteRow, _ col: Int32) throws(StoreError) -> Device {
        guard let id = r.text(col), let platform = r.text(col + 1).flatMap(Platform.init(rawValue:)),
              let tags = StoredForm.tags(r.json(col + 2))
        else { throw corrupt("device") }
        return Device(deviceId: id, platform: platform, tags: tags, lastSeenAt: r.int64(col + 3),
                      viewGeneration: r.int64(col + 4), push: try StoredForm.push(r.json(col + 5), isNull: r.isNull(col + 5), corrupt))
    }

    func preferences(_ user: UserKey) throws(StoreError) -> Preferences {
        var out = Preferences.unsaved
        try db.query("SELECT preferences FROM preferences WHERE app = ? AND user = ?", [.text(user.app), .text(user.user)]) { r throws(StoreError) in
            guard let p = r.json(0).flatMap(Preferences.init(json:)) else { throw corrupt("preferences of \(user)") }
            out = p
            return false
        }
        return out
    }

    func devices(_ user: UserKey) throws(StoreError) -> [Device] {
        var out: [Device] = []
        try db.query("""
            SELECT device_id, platform, tags, last_seen_at, view_generation, push FROM devices WHERE app = ? AND user = ? ORDER BY rowid
            """, [.text(user.app), .text(user.user)]) { r throws(StoreError) in
            out.append(try device(r, 0))
            return true
        }
        return out
    }

    /// One statement per app of `users` (a batch's are mostly of one app),
    /// their ids a JSON array: a statement per user cost ten times as much,
    /// for every batch of an app with push.
    func pushDevices(of users: [UserKey]) throws(StoreError) -> [UserKey: [Device]] {
        var out: [UserKey: [Device]] = [:]
        for (app, keys) in Dictionary(grouping: users, by: \.app) {
            let ids = JSON.array(keys.map { .string($0.user) }).encodedString
            try db.query(SQLiteStore.pushDevicesSQL, [.text(app), .text(ids)]) { r throws(StoreError) in
                guard let user = r.text(0) else { throw corrupt("device") }
                out[UserKey(app: app, user: user), default: []].append(try device(r, 1))
                return true
            }
        }
        return out
    }
    func usersWithDevices(app: String) throws(StoreError) -> [(user: String, devices: [Device])] {
        var out: [(user: String, devices: [Device])] = []
        try db.query("""
            SELECT user, device_id, platform, tags, last_seen_at, view_generation, push FROM devices WHERE app = ? ORDER BY user, rowid
            """, [.text(app)]) { r throws(StoreError) in
            guard let u = r.text(0) else { throw corrupt("device") }
            let d = try device(r, 1)
            if out.last?.user == u { out[out.count - 1].devices.append(d) } else { out.append((user: u, devices: [d])) }
            return true
        }
        return out
    }
}

/// A read-only second connection to a store's file, for one thread other
/// than the owner's. Under WAL it reads while the owner writes: it neither
/// waits for the owner's transactions nor holds them up, and sees only what
/// they committed.
final class SQLiteStoreReader: StoreReader {
    let epoch: String
    /// Internal for tests (a write must fail).
    let reads: SQLiteReads

    init(path: String, epoch: String, busyTimeoutMillis: Int) throws(StoreError) {
        self.epoch = epoch
        let db = try SQLiteDatabase(path: path, readOnly: true)
        reads = SQLiteReads(db: db)
        try db.execute("PRAGMA busy_timeout = \(max(0, busyTimeoutMillis))")
    }

    func read<T>(_ body: (StoreReading) throws(StoreError) -> T) throws(StoreError) -> T {
        let db = reads.db
        // Nested: the outer snapshot serves it.
        guard db.autocommit else { return try body(self) }
        try db.execute("BEGIN")
        do throws(StoreError) {
            // A deferred BEGIN takes its snapshot at the first read, which
            // could come after commits made once `read` began: read now.
            try db.execute("SELECT 1 FROM meta LIMIT 1")
            let r = try body(self)
            try db.execute("COMMIT")
            return r
        } catch {
            if !db.autocommit { _ = try? db.execute("ROLLBACK") }
            throw error
        }
    }

    func feed(_ user: UserKey) throws(StoreError) -> FeedState { try reads.feed(user) }
    func notification(_ user: UserKey, id: String) throws(StoreError) -> Notification? { try reads.notification(user, id: id) }
    func changes(_ user: UserKey, after: Int64, limit: Int) throws(StoreError) -> [ChangeRecord] {
        try reads.changes(user, after: after, limit: limit)
    }
    func history(_ user: UserKey, after: HistoryKey?, limit: Int) throws(StoreError) -> [Notification] {
        try reads.history(user, after: after, limit: limit)
    }
    func counts(_ user: UserKey) throws(StoreError) -> [TargetingCounts] { try reads.counts(user) }
    func devices(_ user: UserKey) throws(StoreError) -> [Device] { try reads.devices(user) }
    func preferences(_ user: UserKey) throws(StoreError) -> Preferences { try reads.preferences(user) }
    func pushDevices(of users: [UserKey]) throws(StoreError) -> [UserKey: [Device]] { try reads.pushDevices(of: users) }
    func next(_ deadline: Deadline) throws(StoreError) -> Millis? { try reads.next(deadline) }
}
