import Foundation
import HeraldCore

/// A SQLite store split into partitions (`--partitions`): one file per
/// partition, each with its own writer (its engine) and its own log, so
/// that partitions commit and sync beside each other. Partition 0 is the
/// file named (`PATH`), partition i ≥ 1 is `PATH.pI`. A user's rows live in
/// the file of its partition (`Partition.index`); the files share one epoch,
/// so a user's cursors stay valid wherever its rows go.
///
/// The layout in force is recorded in partition 0's `meta` (`partitions`).
/// Opening with another count (a file of an older Herald counts as one)
/// moves each user whose partition changed into its new file first
/// (`arrange`). The move is safe to interrupt at any point, `kill -9`
/// included, and runs again at the next open:
/// - partition 0's `meta` records the target (`repartition`) before any
///   row moves, so an interrupted move is finished at the next open;
/// - a user is copied whole into its new file in one transaction, which is
///   durable before the user is deleted from the old one in another; in
///   between the two copies are the same (nothing is served during a move),
///   so the next run may copy from either;
/// - a file past the new count is removed only once it holds no user, and
///   only then does `meta` record the new count.
public enum SQLitePartitionFiles {
    /// The file of partition `i` of the store named `base`.
    public static func path(_ base: String, partition i: Int) -> String { i == 0 ? base : "\(base).p\(i)" }

    /// The tables whose rows each belong to one user, keyed by (app, user):
    /// they move with their user. (`meta` is each file's own, `shared_tokens`
    /// partition 0's, and the webhook outbox's rows are events a partition
    /// sends, whoever's they were: they move only out of a file that goes.)
    static let userTables = ["feeds", "notifications", "changes", "devices", "counts", "push_outbox", "push_tap_spacing", "preferences"]

    /// Users copied in one transaction: bounds the log a move writes between syncs.
    static let usersPerCopy = 1000

    /// Opens the `count` partitions of the store at `base` (`open` opens one
    /// file), after moving users between files if the layout on disk is
    /// another (`arrange`); without `count`, as many as the files are laid
    /// out for (the target of a move under way), one for a new store.
    /// Refuses a set of files that do not belong together: one missing, or
    /// one of another store (another epoch).
    public static func open(base: String, count: Int?, log: (String) -> Void = { _ in },
                            _ open: (String) throws(StoreError) -> SQLiteStore) throws(StoreError) -> [SQLiteStore] {
        let count = try arrange(base: base, count: count, log: log)
        var stores: [SQLiteStore] = []
        do throws(StoreError) {
            for i in 0..<count {
                let store = try open(path(base, partition: i))
                stores.append(store)
                if i == 0 {
                    // Again under partition 0's own lock: another process may
                    // have moved the users since `arrange`.
                    let layout = try self.layout(store.db)
                    guard layout.recorded == count, layout.moving == nil else {
                        throw StoreError("sqlite (\(base)): another process changed the partition files while they were opened; start again")
                    }
                }
                guard store.epoch == stores[0].epoch else {
                    throw StoreError("sqlite (\(store.path)): partition \(i) of \(base) belongs to another store (epoch \(store.epoch), not \(stores[0].epoch)); refusing to open the set")
                }
            }
        } catch {
            for s in stores { s.close() }
            throw error
        }
        return stores
    }

    /// What partition 0's `meta` records: the layout in force, and the target of a move under way.
    private static func layout(_ db: SQLiteDatabase) throws(StoreError) -> (recorded: Int, moving: Int?) {
        (try SQLiteStore.meta("partitions", in: db).flatMap { Int($0) } ?? 1,
         try SQLiteStore.meta("repartition", in: db).flatMap { Int($0) })
    }

    /// The partitions i ≥ 1 with a file `PATH.pI` beside `base`, whatever
    /// layout or interrupted moves left them.
    static func filesPresent(_ base: String) -> Set<Int> {
        let url = URL(fileURLWithPath: base)
        let prefix = url.lastPathComponent + ".p"
        let names = (try? FileManager.default.contentsOfDirectory(atPath: url.deletingLastPathComponent().path)) ?? []
        return Set(names.compactMap { name in
            guard name.hasPrefix(prefix), let i = Int(name.dropFirst(prefix.count)), i >= 1,
                  name == url.lastPathComponent + ".p\(i)" else { return nil }
            return i
        })
    }

    /// Puts every user into the file of its partition among `count` (nil:
    /// the count recorded, or being moved to), and records that layout;
    /// moves nothing when it is already so. The count in force.
    /// `stop` (tests) ends it as a crash would, before its next durable step.
    @discardableResult
    static func arrange(base: String, count asked: Int?, log: (String) -> Void, stop: Countdown? = nil) throws(StoreError) -> Int {
        precondition(asked ?? 1 >= 1, "partitions")
        let lock = try SQLiteFileLock(databasePath: base)
        defer { lock.release() }
        // Every partition file there, whatever layout or moves left it: a
        // move stopped twice may have left one past both counts.
        let present = filesPresent(base)
        guard exists(base) || present.isEmpty else {
            throw StoreError("sqlite (\(base)): the file of partition 0 is missing, beside \(present.sorted().map { path(base, partition: $0) }.joined(separator: ", ")); restore it (the files of a store are backed up and restored together). Nothing was changed.")
        }
        let first = try connect(path(base, partition: 0))
        defer { first.close() }
        let (recorded, interrupted) = try layout(first)
        let count = asked ?? interrupted ?? recorded
        let epoch = try SQLiteStore.meta("epoch", in: first) ?? ""
        // The files both the layout and a move under way keep are there:
        // a move makes only files past the old count and removes only
        // files past its own.
        for i in 1..<max(1, min(recorded, interrupted ?? recorded)) where !present.contains(i) {
            throw StoreError("sqlite (\(base)): partition file \(path(base, partition: i)) of \(recorded) is missing; restore it (the files of a store are backed up and restored together). Nothing was changed.")
        }
        if interrupted == nil && recorded == count && present.allSatisfy({ $0 < count }) {
            // Before anything changes: every file of a layout in force is this store's.
            for i in present.sorted() { try checkBelongs(path(base, partition: i), epoch: epoch, strict: true) }
            try settleHandles((0..<count).map { path(base, partition: $0) }, stop)
            return count
        }
        // Before anything changes: every file there is this store's.
        for i in present.sorted() { try checkBelongs(path(base, partition: i), epoch: epoch, strict: false) }
        // Then no handle is in two files, and none comes to be by a move.
        try settleHandles([base] + present.sorted().map { path(base, partition: $0) }, stop)
        log("sqlite: moving users from \(recorded) to \(count) partition file(s)\(interrupted.map { " (finishing an interrupted move to \($0))" } ?? "")")
        try setMeta(first, ["repartition": String(count)], removing: [], stop)
        let span = max(count, (present.max() ?? 0) + 1)
        var files: [SQLiteDatabase?] = []
        defer { for f in files { f?.close() } }
        for i in 0..<span {
            let p = path(base, partition: i)
            guard i > 0 else { files.append(first); continue }
            guard i < count || present.contains(i) else { files.append(nil); continue }
            let db = try connect(p)
            files.append(db)
            // An empty file takes the store's epoch: new, or made by a move
            // stopped before it got it (`checkBelongs` let only those by).
            if try SQLiteStore.meta("epoch", in: db) != epoch {
                try setMeta(db, ["epoch": epoch], removing: [], stop)
            }
        }
        var moved = 0
        for (i, db) in files.enumerated() {
            guard let db else { continue }
            moved += try moveOut(of: db, partition: i, count: count, base: base, stop)
        }
        for i in count..<span {
            guard let db = files[i] else { continue }
            try copy(webhooksOf: db, into: path(base, partition: 0), stop)
            // The log copied in and emptied, so that none is left to replay.
            var busy: Int64 = 1
            try db.query("PRAGMA wal_checkpoint(TRUNCATE)") { r throws(StoreError) in busy = r.int64(0); return false }
            guard busy == 0 else { throw StoreError("sqlite (\(path(base, partition: i))): its log could not be checkpointed before removing it") }
            db.close()
            files[i] = nil
            try stop?.step()
            try remove(path(base, partition: i))
        }
        try setMeta(first, ["partitions": String(count)], removing: ["repartition"], stop)
        log("sqlite: \(moved) user(s) moved; \(count) partition file(s) in force")
        return count
    }

    /// Moves the users in `db` (partition `index`) that belong to another
    /// partition among `count` into that one's file; how many.
    private static func moveOut(of db: SQLiteDatabase, partition index: Int, count: Int, base: String,
                                _ stop: Countdown?) throws(StoreError) -> Int {
        let leaving = Partition.split(try users(in: db), among: count).filter { $0.key != index }
        guard !leaving.isEmpty else { return 0 }
        try db.script("CREATE TEMP TABLE IF NOT EXISTS moving (app TEXT NOT NULL, user TEXT NOT NULL, PRIMARY KEY (app, user)) WITHOUT ROWID")
        let mine = "(app, user) IN (SELECT app, user FROM temp.moving)"
        for (target, group) in leaving.sorted(by: { $0.key < $1.key }) {
            try db.execute("ATTACH DATABASE ? AS dest", [.text(path(base, partition: target))])
            defer { _ = try? db.execute("DETACH DATABASE dest") }
            try db.execute("PRAGMA dest.synchronous = FULL")
            var copy: [String] = []
            for table in userTables {
                let cols = try columns(of: table, in: db).joined(separator: ", ")
                let order = try hasRowid(table, in: db) ? " ORDER BY rowid" : ""
                copy += ["DELETE FROM dest.\(table) WHERE \(mine)",
                         "INSERT INTO dest.\(table) (\(cols)) SELECT \(cols) FROM main.\(table) WHERE \(mine)\(order)"]
            }
            var start = 0
            while start < group.count {
                let chunk = group[start..<min(group.count, start + usersPerCopy)]
                start += chunk.count
                try inTransaction(db, stop) { () throws(StoreError) in
                    try db.execute("DELETE FROM temp.moving")
                    for u in chunk { try db.execute("INSERT INTO temp.moving VALUES (?, ?)", [.text(u.app), .text(u.user)]) }
                }
                // The copy is durable in its file before the original goes.
                try inTransaction(db, stop) { () throws(StoreError) in
                    for statement in copy { try db.execute(statement) }
                }
                try inTransaction(db, stop) { () throws(StoreError) in
                    for table in userTables { try db.execute("DELETE FROM main.\(table) WHERE \(mine)") }
                }
            }
        }
        return leaving.values.reduce(0) { $0 + $1.count }
    }

    /// Refuses a file of another store: another epoch, and (unless
    /// `strict`, for a file a stopped move may have made, with any) rows in
    /// it. Changes nothing.
    private static func checkBelongs(_ p: String, epoch: String, strict: Bool) throws(StoreError) {
        let db = try SQLiteDatabase(path: p)
        defer { db.close() }
        try SQLiteStore.checkVersion(db, path: p)
        let made = try db.int("PRAGMA user_version") ?? 0 > 0
        if made, try SQLiteStore.meta("epoch", in: db) == epoch { return }
        var tables: [String] = []
        try db.query("SELECT name FROM sqlite_master WHERE type = 'table'") { r throws(StoreError) in
            if let n = r.text(0), (userTables + ["webhook_outbox", "shared_tokens"]).contains(n) { tables.append(n) }
            return true
        }
        let rows = tables.map { "SELECT 1 FROM \($0)" }.joined(separator: " UNION ALL ")
        var empty = true
        if !rows.isEmpty { empty = try db.int("SELECT EXISTS (\(rows))") == 0 }
        guard !strict, empty else {
            throw StoreError("sqlite (\(p)): the file belongs to another store (another epoch than its partition 0's); refusing to move users into or out of it. Nothing was changed.")
        }
    }

    /// A push handle is one registration's in an app, but a partition gives
    /// one up to another partition's registration in a batch after the one
    /// that took it (`FeedOperations.saveDevice`), so a stop in between
    /// leaves two files holding it: the registration seen last keeps it,
    /// and the other loses it with its waiting pushes (as
    /// `FeedTransaction.removeHandle` does for a handle that moved).
    private static func settleHandles(_ paths: [String], _ stop: Countdown?) throws(StoreError) {
        guard paths.count > 1 else { return }
        // Each opened at the current schema before any is attached: a stop
        // may have left one just made, with no tables yet.
        var files: [SQLiteDatabase] = []
        defer { for f in files { f.close() } }
        for p in paths { files.append(try connect(p)) }
        for (i, db) in files.enumerated().dropLast() {
            for other in paths[(i + 1)...] {
                try db.execute("ATTACH DATABASE ? AS other", [.text(other)])
                defer { _ = try? db.execute("DETACH DATABASE other") }
                try db.execute("PRAGMA other.synchronous = FULL")
                var losers: [(schema: String, app: String, user: String, device: String)] = []
                try db.query("""
                    SELECT a.app, a.user, a.device_id, a.last_seen_at, b.user, b.device_id, b.last_seen_at
                    FROM main.devices a JOIN other.devices b ON b.app = a.app AND b.push_key = a.push_key
                    WHERE a.push_key IS NOT NULL AND b.push_key IS NOT NULL
                        AND NOT (b.user = a.user AND b.device_id = a.device_id)  -- one user in two files, mid-move
                    """) { r throws(StoreError) in
                    guard let app = r.text(0), let u = r.text(1), let d = r.text(2), let ou = r.text(4), let od = r.text(5) else { return true }
                    losers.append(r.int64(3) < r.int64(6) ? ("main", app, u, d) : ("other", app, ou, od))
                    return true
                }
                for l in losers {
                    let key: [SQLiteValue] = [.text(l.app), .text(l.user), .text(l.device)]
                    try inTransaction(db, stop) { () throws(StoreError) in
                        try db.execute("UPDATE \(l.schema).devices SET push = NULL, push_key = NULL WHERE app = ? AND user = ? AND device_id = ?", key)
                        try db.execute("DELETE FROM \(l.schema).push_outbox WHERE app = ? AND user = ? AND device_id = ?", key)
                    }
                }
            }
        }
    }

    /// The users with rows in `db`.
    private static func users(in db: SQLiteDatabase) throws(StoreError) -> [UserKey] {
        var users: [UserKey] = []
        let union = userTables.map { "SELECT app, user FROM \($0)" }.joined(separator: " UNION ")
        try db.query(union) { r throws(StoreError) in
            if let app = r.text(0), let user = r.text(1) { users.append(UserKey(app: app, user: user)) }
            return true
        }
        return users
    }

    /// Moves the webhook deliveries waiting in `db` (a file that goes) into
    /// the file at `target`.
    private static func copy(webhooksOf db: SQLiteDatabase, into target: String, _ stop: Countdown?) throws(StoreError) {
        try db.execute("ATTACH DATABASE ? AS dest", [.text(target)])
        defer { _ = try? db.execute("DETACH DATABASE dest") }
        try db.execute("PRAGMA dest.synchronous = FULL")
        let cols = try columns(of: "webhook_outbox", in: db).joined(separator: ", ")
        // Once per event and endpoint, should a stop have come before the
        // delete (looked up in a table keyed so: the outbox has no such index).
        try db.script("CREATE TEMP TABLE IF NOT EXISTS queued (app TEXT, url TEXT, event_id TEXT, PRIMARY KEY (app, url, event_id)) WITHOUT ROWID")
        try inTransaction(db, stop) { () throws(StoreError) in
            try db.execute("DELETE FROM temp.queued")
            try db.execute("INSERT OR IGNORE INTO temp.queued SELECT app, url, event_id FROM dest.webhook_outbox")
            try db.execute("""
                INSERT INTO dest.webhook_outbox (\(cols)) SELECT \(cols) FROM main.webhook_outbox m WHERE NOT EXISTS
                    (SELECT 1 FROM temp.queued q WHERE q.app = m.app AND q.url = m.url AND q.event_id = m.event_id) ORDER BY id
                """)
        }
        try inTransaction(db, stop) { () throws(StoreError) in try db.execute("DELETE FROM main.webhook_outbox") }
    }

    /// A table's columns but a rowid alias (`id INTEGER PRIMARY KEY`), which
    /// the receiving file assigns anew.
    private static func columns(of table: String, in db: SQLiteDatabase) throws(StoreError) -> [String] {
        var cols: [String] = []
        try db.query("SELECT name, type, pk FROM pragma_table_info(?)", [.text(table)]) { r throws(StoreError) in
            let alias = r.int64(2) == 1 && r.text(1)?.uppercased() == "INTEGER"
            if !alias, let n = r.text(0) { cols.append("\"\(n)\"") }
            return true
        }
        guard !cols.isEmpty else { throw StoreError("sqlite (\(db.path)): no table \(table)") }
        return cols
    }

    private static func hasRowid(_ table: String, in db: SQLiteDatabase) throws(StoreError) -> Bool {
        let sql = try db.text("SELECT sql FROM sqlite_master WHERE type = 'table' AND name = ?", [.text(table)]) ?? ""
        return !sql.uppercased().contains("WITHOUT ROWID")
    }

    /// A connection to the file at `p`, created if missing, at the current
    /// schema, its commits synced.
    private static func connect(_ p: String) throws(StoreError) -> SQLiteDatabase {
        let db = try SQLiteDatabase(path: p)
        do throws(StoreError) {
            try db.execute("PRAGMA busy_timeout = 5000")
            try SQLiteStore.checkVersion(db, path: p)
            guard try db.text("PRAGMA journal_mode = WAL")?.lowercased() == "wal" else {
                throw StoreError("sqlite (\(p)): cannot use WAL mode")
            }
            try db.execute("PRAGMA synchronous = FULL")
            try SQLiteStore.migrate(db, path: p)
        } catch {
            db.close()
            throw error
        }
        return db
    }

    private static func setMeta(_ db: SQLiteDatabase, _ values: [String: String], removing: [String],
                                _ stop: Countdown?) throws(StoreError) {
        try inTransaction(db, stop) { () throws(StoreError) in
            for (k, v) in values { try SQLiteStore.setMeta(k, v, in: db) }
            for k in removing { try db.execute("DELETE FROM meta WHERE key = ?", [.text(k)]) }
        }
    }

    /// One durable step of a move, which `stop` (tests) may end before it begins.
    private static func inTransaction(_ db: SQLiteDatabase, _ stop: Countdown?, _ body: () throws(StoreError) -> Void) throws(StoreError) {
        try stop?.step()
        try db.immediateTransaction(body)
    }

    private static func exists(_ p: String) -> Bool { FileManager.default.fileExists(atPath: p) }

    /// Removes a closed file that holds no user: its log and shared memory
    /// first, so that no stale log is ever left beside a newer file of the
    /// same name; its lock last.
    private static func remove(_ p: String) throws(StoreError) {
        for suffix in ["-wal", "-shm", "", ".lock"] where exists(p + suffix) {
            do { try FileManager.default.removeItem(atPath: p + suffix) } catch {
                throw StoreError("sqlite (\(p)): cannot remove \(p + suffix) after moving its users out: \(error)")
            }
        }
    }

    /// Ends a move (tests) before its `left`-th durable step, as a crash there would.
    final class Countdown {
        private var left: Int
        init(_ steps: Int) { left = steps }
        func step() throws(StoreError) {
            guard left > 0 else { throw StoreError("stopped") }
            left -= 1
        }
    }
}
