import CSQLite
import HeraldCore

/// The durable embedded store (`--store sqlite:PATH`): one SQLite file in
/// WAL mode per partition (`SQLitePartitionFiles`), written only by its
/// engine thread; other threads read through their own read-only
/// connections (`makeReader()`).
///
/// Durability: the engine runs a batch of commands between `begin()` and
/// `commit()` (group commit), so `commit()` is where the batch is made
/// durable, with at most one fsync of the write-ahead log per batch under
/// `.full`. Every write method also works outside `begin()`/`commit()`, as
/// its own transaction.
///
/// Schema: versioned with `PRAGMA user_version` (mirrored in `meta`);
/// forward migrations run at open inside one write transaction. A file
/// written by a newer Herald, a file that is not a SQLite database and a
/// SQLite database that is not Herald's are refused with a `StoreError` and
/// left untouched.
///
/// The epoch is random, made when the database is created, and stays the
/// same for the life of the file: a restarted gateway keeps its clients'
/// cursors valid. A user's `head` lives in `feeds` and never goes back, so a
/// seq is never reused across restarts (a rolled-back seq was never
/// acknowledged, so reusing it is harmless).
public final class SQLiteStore: NotificationStore {
    /// How hard `commit()` works to survive a crash (`PRAGMA synchronous`
    /// under WAL).
    ///
    /// - `full` (default): the WAL is fsynced at every commit. A commit that
    ///   returned survives a process crash (`kill -9`), an OS crash and a
    ///   power cut. Costs one fsync per batch, which group commit shares
    ///   among all the requests of a batch.
    /// - `normal`: the WAL is fsynced only at checkpoints. A commit survives
    ///   a process crash (the data is in the OS's page cache), but the last
    ///   commits before an OS crash or power cut can be lost (the database
    ///   stays consistent: whole transactions are lost, never half of one).
    ///   Several times faster for small batches on slow disks.
    /// - `off`: no fsync at all. Survives a process crash; an OS crash or
    ///   power cut can lose recent commits and may corrupt the file. For
    ///   tests and throwaway data only.
    public enum Durability: String, Sendable, CaseIterable {
        case full, normal, off
    }

    /// The schema version this code writes; `migrations[v - 1]` brings a
    /// database from version `v - 1` to `v`.
    public static let schemaVersion: Int64 = 15

    public let epoch: String
    public let path: String
    public let durability: Durability

    /// Internal for tests (query plans, schema tampering).
    let db: SQLiteDatabase
    /// Held while open; nil for an in-memory database.
    private var fileLock: SQLiteFileLock?
    private let reads: SQLiteReads
    /// Readers wait on locks as long as the store does.
    private let busyTimeoutMillis: Int
    /// Inside `begin()` … `commit()`/`rollback()`.
    private var inTransaction = false
    /// Copies the log into the file off the engine thread; nil for an
    /// in-memory database. Internal for tests.
    private(set) var checkpointer: SQLiteCheckpointer?
    /// Set when commits leave their sync to the engine's sync thread.
    public private(set) var commitSync: CommitSync?

    /// Opens (creating if needed) the database at `path` and migrates it to
    /// the current schema. `busyTimeoutMillis` bounds how long a call waits
    /// for a lock held by another connection before failing with a
    /// `StoreError`. A file another store (in any process) has open is
    /// refused (`SQLiteFileLock`).
    /// `checkpointPages`: the log's size, in 4 KiB pages, past which it
    /// starts over; it is copied into the file every quarter of that
    /// (`SQLiteCheckpointer`). `deferredSync` (at `full` durability, on a
    /// file): `commit()` writes the log without syncing it and `commitSync`
    /// syncs it; the engine then acknowledges a batch only after that sync,
    /// which runs beside the next batch (`SQLiteLogSync`). `nameThread`
    /// names the checkpoint thread (called on it), so that tools show it.
    public init(path: String, durability: Durability = .full, busyTimeoutMillis: Int = 5000,
                checkpointPages: Int32 = 16384, deferredSync: Bool = false,
                nameThread: @escaping @Sendable (String) -> Void = { _ in }) throws(StoreError) {
        self.path = path
        self.durability = durability
        self.busyTimeoutMillis = busyTimeoutMillis
        let defers = deferredSync && durability == .full && !Self.isMemoryPath(path)
        // Before the file is opened, so that a refused second gateway changes nothing.
        fileLock = Self.isMemoryPath(path) ? nil : try SQLiteFileLock(databasePath: path)
        db = try SQLiteDatabase(path: path)
        reads = SQLiteReads(db: db)
        do throws(StoreError) {
            try db.execute("PRAGMA busy_timeout = \(max(0, busyTimeoutMillis))")
            // Look before changing anything (even the journal mode is a
            // write): refuse what is not ours or is newer than us.
            try Self.checkVersion(db, path: path)
            let mode = try db.text("PRAGMA journal_mode = WAL")
            if mode?.lowercased() != "wal" && !Self.isMemoryPath(path) {
                throw StoreError("sqlite (\(path)): cannot use WAL mode (journal_mode is \(mode ?? "unknown"))")
            }
            // NORMAL syncs the log at checkpoints only (and the checkpoint
            // thread's connection stays at `durability`): `commitSync` syncs
            // it after each commit.
            try db.execute("PRAGMA synchronous = \(defers ? "NORMAL" : durability.rawValue.uppercased())")
            try db.execute("PRAGMA cache_size = -65536")      // 64 MiB
            try db.execute("PRAGMA temp_store = MEMORY")
            // The log starts over every 64 MiB, not every 4 MiB (SQLite's
            // default), and is copied in passes of 16 MiB on a thread of its
            // own (below): publishes to many users dirty the same index pages
            // batch after batch, and a pass copies each page once however
            // often it changed (publishes: ~6,500/s -> ~7,900/s on the
            // benchmark machine). Past the start-over the log is written again
            // from its top: left at its size, those writes reuse blocks the
            // file already has, and a sync after them is about twice as fast
            // as one after writes that grow the file (measured on the
            // benchmark disk). It is truncated only after growing far past
            // that (a reader held the passes back).
            try db.execute("PRAGMA journal_size_limit = \(Int64(checkpointPages) * 4096 * 4)")
            try Self.migrate(db, path: path)
            // One process writes a SQLite file: pushes claimed before this
            // open were in flight when it stopped, and go again at once
            // rather than when their claim would have run out.
            for outbox in [Self.pushOutbox, Self.webhookOutbox] { try db.execute(outbox.releaseAll) }
            guard let e = try Self.meta("epoch", in: db), !e.isEmpty else {
                throw StoreError("sqlite (\(path)): the database has no epoch (damaged?)")
            }
            epoch = e
            if defers {
                guard let log = db.logPath else { throw StoreError("sqlite (\(path)): no write-ahead log file") }
                let sync = try SQLiteLogSync(logPath: log)
                // What a previous run committed without syncing (it crashed)
                // is durable before anything of it is served again.
                try sync.sync()
                commitSync = sync
            }
        } catch {
            db.close()
            throw error
        }
        guard !Self.isMemoryPath(path) else { return }
        do throws(StoreError) {
            checkpointer = try SQLiteCheckpointer(path: path, durability: durability, pages: checkpointPages,
                                                  nameThread: nameThread)
        } catch {
            db.close()
            throw error
        }
        checkpointer?.watch(db)
    }

    deinit {
        checkpointer?.stop(db)
        db.close()
    }

    /// Closes the database (the WAL is checkpointed into the main file).
    /// Every later call fails with a `StoreError`. An open transaction is
    /// rolled back.
    public func close() {
        if inTransaction { rollback() }
        checkpointer?.stop(db)
        checkpointer = nil
        if db.isOpen { _ = try? db.execute("PRAGMA optimize") }
        db.close()
        fileLock?.release()
    }

    private static func isMemoryPath(_ p: String) -> Bool { p == ":memory:" || p.isEmpty || p.hasPrefix("file::memory:") }

    // MARK: Schema

    static func checkVersion(_ db: SQLiteDatabase, path: String) throws(StoreError) {
        let version = try db.int("PRAGMA user_version") ?? 0
        if version > schemaVersion {
            throw StoreError("sqlite (\(path)): the database has schema version \(version), newer than the \(schemaVersion) this Herald understands; refusing to open it (upgrade Herald, or use another file). The file was not modified.")
        }
        if version == 0 {
            let objects = try db.int("SELECT count(*) FROM sqlite_master") ?? 0
            if objects > 0 {
                throw StoreError("sqlite (\(path)): the file is a SQLite database but not a Herald one (no schema version); refusing to use it. The file was not modified.")
            }
        }
    }

    /// Forward migrations. Append only; never edit a released one.
    private static let migrations: [String] = [
        // 1: the initial schema.
        """
        CREATE TABLE meta (
            key   TEXT PRIMARY KEY,
            value TEXT NOT NULL
        ) WITHOUT ROWID;

        -- One row per user with a change feed: head is the last seq assigned,
        -- floor the highest pruned seq. Rows are never deleted.
        CREATE TABLE feeds (
            app   TEXT NOT NULL,
            user  TEXT NOT NULL,
            head  INTEGER NOT NULL,
            floor INTEGER NOT NULL DEFAULT 0,
            PRIMARY KEY (app, user)
        ) WITHOUT ROWID;

        -- Live notifications. `json` is the wire form (Notification.json);
        -- the other columns are copies for lookups, ordering and counts.
        CREATE TABLE notifications (
            app                 TEXT NOT NULL,
            user                TEXT NOT NULL,
            id                  TEXT NOT NULL,
            app_notification_id TEXT NOT NULL,
            created_at          INTEGER NOT NULL,
            expires_at          INTEGER NOT NULL,
            read_state          TEXT NOT NULL,
            user_action_state   TEXT NOT NULL,
            version             INTEGER NOT NULL,
            targeted            INTEGER NOT NULL,
            json                TEXT NOT NULL
        );
        CREATE UNIQUE INDEX notifications_by_id ON notifications (app, user, id);
        CREATE UNIQUE INDEX notifications_by_app_id ON notifications (app, user, app_notification_id);
        -- History order: newest first, ties by the higher id (BINARY = bytes).
        CREATE INDEX notifications_history ON notifications (app, user, created_at DESC, id DESC);
        CREATE INDEX notifications_expiry ON notifications (expires_at);

        -- The change feed, one row per seq. `change` is the wire form (Change.json). The
        -- before/after presence: *_unread is NULL when absent (no before for
        -- a new notification, no after for a delete), else 1/0; *_platforms
        -- is NULL for all platforms, else comma-separated; *_tags the tag
        -- expression's source, NULL for all devices.
        CREATE TABLE changes (
            app              TEXT NOT NULL,
            user             TEXT NOT NULL,
            seq              INTEGER NOT NULL,
            at               INTEGER NOT NULL,
            change           TEXT NOT NULL,
            before_unread    INTEGER,
            before_platforms TEXT,
            before_tags      TEXT,
            after_unread     INTEGER,
            after_platforms  TEXT,
            after_tags       TEXT,
            PRIMARY KEY (app, user, seq)
        ) WITHOUT ROWID;
        -- Clustered by (app, user, seq): a catch-up reads one contiguous run.
        -- The index by `at` carries the key, so pruning reads only it.
        CREATE INDEX changes_by_at ON changes (at);

        -- Device registrations; rowid keeps registration order.
        CREATE TABLE devices (
            app          TEXT NOT NULL,
            user         TEXT NOT NULL,
            device_id    TEXT NOT NULL,
            platform     TEXT NOT NULL,
            tags         TEXT NOT NULL,
            last_seen_at INTEGER NOT NULL
        );
        -- Also serves "devices of an app" (its prefix).
        CREATE UNIQUE INDEX devices_by_id ON devices (app, user, device_id);
        CREATE INDEX devices_by_last_seen ON devices (last_seen_at);
        """,
        // 2: Device.viewGeneration (bumped when a device's platform or tags change).
        """
        ALTER TABLE devices ADD COLUMN view_generation INTEGER NOT NULL DEFAULT 0;
        """,
        // 3: counts, so that counting a user's notifications never reads
        // their history; filled from the notifications by `backfillCounts`.
        """
        -- Live notifications per user and targeting (see TargetingKey): kept
        -- by every upsert and delete in the same transaction; a row whose
        -- total reaches 0 is deleted. `platforms` is '*' for all platforms,
        -- else the comma-separated set in a fixed order; `tags` the tag
        -- expression's source, '' for all devices.
        CREATE TABLE counts (
            app            TEXT NOT NULL,
            user           TEXT NOT NULL,
            platforms      TEXT NOT NULL,
            tags           TEXT NOT NULL,
            unread         INTEGER NOT NULL,
            no_interaction INTEGER NOT NULL,
            total          INTEGER NOT NULL,
            PRIMARY KEY (app, user, platforms, tags)
        ) WITHOUT ROWID;
        """,
        // 4: the counts of notifications for everyone (platforms '*', tags
        // '') move into the feed row, which every write updates anyway: one
        // statement and one page less per publish (durable publishes at
        // 5,000/s: p99 128-166 -> 78-82 ms without that row's update).
        // A user with counts but no feed row gets one at head 0, which reads
        // as no feed.
        """
        ALTER TABLE feeds ADD COLUMN unread INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE feeds ADD COLUMN no_interaction INTEGER NOT NULL DEFAULT 0;
        ALTER TABLE feeds ADD COLUMN total INTEGER NOT NULL DEFAULT 0;
        INSERT INTO feeds (app, user, head, floor, unread, no_interaction, total)
            SELECT app, user, 0, 0, unread, no_interaction, total FROM counts WHERE platforms = '*' AND tags = ''
            ON CONFLICT (app, user) DO UPDATE SET
                unread = excluded.unread, no_interaction = excluded.no_interaction, total = excluded.total;
        DELETE FROM counts WHERE platforms = '*' AND tags = '';
        """,
        // 5: a notification's JSON is written once, in its change (a 64 KiB
        // notification was written twice): the notification row points at
        // that change (`seq`) and leaves `json` empty, and the change stays
        // while pointed at, past its retention too (then below the feed's
        // floor, never served as a change; `pruneChanges`). Rows written
        // before keep their JSON and a NULL seq; the counts read their
        // targeting from it and that of newer rows from columns, so the
        // migration only adds columns. A change names its upsert's
        // notification, so pruning can tell which are pointed at.
        """
        ALTER TABLE notifications ADD COLUMN seq INTEGER;
        ALTER TABLE notifications ADD COLUMN target_platforms TEXT;
        ALTER TABLE notifications ADD COLUMN target_tags TEXT;
        ALTER TABLE changes ADD COLUMN notification_id TEXT;
        """,
        // 6: push handles on registrations and the push outbox (SPEC section 10).
        """
        -- The handle's full form (PushHandle.json) and its key, unique in
        -- the app (PushHandle.key): registering it elsewhere moves it.
        ALTER TABLE devices ADD COLUMN push TEXT;
        ALTER TABLE devices ADD COLUMN push_key TEXT;
        CREATE UNIQUE INDEX devices_by_push_key ON devices (app, push_key) WHERE push_key IS NOT NULL;

        -- Pushes recorded with the changes they wake devices for. A row is
        -- due at due_at and held by its sender until claimed_until; one tap
        -- row per device at most (its generation counts replacements).
        CREATE TABLE push_outbox (
            id            INTEGER PRIMARY KEY,
            app           TEXT NOT NULL,
            user          TEXT NOT NULL,
            device_id     TEXT NOT NULL,
            kind          TEXT NOT NULL,
            message       TEXT NOT NULL,
            committed_at  INTEGER NOT NULL,
            due_at        INTEGER NOT NULL,
            claimed_until INTEGER NOT NULL DEFAULT 0,
            attempts      INTEGER NOT NULL DEFAULT 0,
            generation    INTEGER NOT NULL DEFAULT 0
        );
        CREATE UNIQUE INDEX push_outbox_taps ON push_outbox (app, user, device_id) WHERE kind = 'tap';
        CREATE INDEX push_outbox_by_device ON push_outbox (app, user, device_id);
        CREATE INDEX push_outbox_due ON push_outbox (due_at);
        """,
        // 7: when each device's next tap may go (PushSettings.tapIntervalSeconds).
        """
        CREATE TABLE push_tap_spacing (
            app        TEXT NOT NULL,
            user       TEXT NOT NULL,
            device_id  TEXT NOT NULL,
            not_before INTEGER NOT NULL,
            PRIMARY KEY (app, user, device_id)
        ) WITHOUT ROWID;
        """,
        // 8: tokens every process signs with (an APNs provider token), by name.
        """
        CREATE TABLE shared_tokens (
            name      TEXT PRIMARY KEY,
            value     TEXT NOT NULL,
            issued_at INTEGER NOT NULL
        ) WITHOUT ROWID;
        """,
        // 9: the outbox's length (`herald_push_pending`), kept by triggers
        // in the transactions that add and remove its rows, so that reading
        // it is no scan of a long outbox.
        """
        CREATE TABLE push_outbox_size (pushes INTEGER NOT NULL);
        INSERT INTO push_outbox_size SELECT count(*) FROM push_outbox;
        CREATE TRIGGER push_outbox_added AFTER INSERT ON push_outbox
        BEGIN UPDATE push_outbox_size SET pushes = pushes + 1; END;
        CREATE TRIGGER push_outbox_removed AFTER DELETE ON push_outbox
        BEGIN UPDATE push_outbox_size SET pushes = pushes - 1; END;
        """,
        // 10: the registrations holding a handle, by user: a batch finds
        // which of its users hold one (`pushDevices`) in this index, which
        // holds only them, so the many users without one cost a probe that
        // finds nothing, and no set of holders is read at open.
        """
        CREATE INDEX devices_with_push ON devices (app, user) WHERE push IS NOT NULL;
        """,
        // 11: seenState apart from readState (SPEC section 11). What was
        // stored before counts as its readState implies (SeenState.implied,
        // docs/PROTOCOL.md): read ones seen, unread ones unseen; so the
        // unseen counts start as the unread ones, and a notification's JSON
        // without the field reads back so. A change recorded before keeps
        // NULL *_unseen, read as its *_unread (StoredForm.presence): the
        // feed is not rewritten.
        """
        ALTER TABLE notifications ADD COLUMN seen_state TEXT NOT NULL DEFAULT 'unseen';
        UPDATE notifications SET seen_state = 'seen' WHERE read_state = 'read';
        ALTER TABLE feeds ADD COLUMN unseen INTEGER NOT NULL DEFAULT 0;
        UPDATE feeds SET unseen = unread WHERE unread <> 0;
        ALTER TABLE counts ADD COLUMN unseen INTEGER NOT NULL DEFAULT 0;
        UPDATE counts SET unseen = unread WHERE unread <> 0;
        ALTER TABLE changes ADD COLUMN before_unseen INTEGER;
        ALTER TABLE changes ADD COLUMN after_unseen INTEGER;
        """,
        // 12: snoozes that end (SPEC section 11). Nothing stored before had
        // a time, so the column starts NULL; the wake sweep finds the few
        // that have one in an index of only them.
        """
        ALTER TABLE notifications ADD COLUMN snoozed_until INTEGER;
        CREATE INDEX notifications_wake ON notifications (snoozed_until) WHERE snoozed_until IS NOT NULL;
        """,
        // 13: preferences (SPEC section 12).
        preferencesMigration,
        // 14: the webhook outbox (SPEC section 13), rows as the push
        // outbox's (OutboxSQL), one per event and endpoint, its length kept
        // by triggers as push_outbox_size is. Renumbered by moving it alone.
        OutboxSQL.webhookTable(id: "INTEGER PRIMARY KEY", integer: "INTEGER") + """
        CREATE TABLE webhook_outbox_size (deliveries INTEGER NOT NULL);
        INSERT INTO webhook_outbox_size VALUES (0);
        CREATE TRIGGER webhook_outbox_added AFTER INSERT ON webhook_outbox
        BEGIN UPDATE webhook_outbox_size SET deliveries = deliveries + 1; END;
        CREATE TRIGGER webhook_outbox_removed AFTER DELETE ON webhook_outbox
        BEGIN UPDATE webhook_outbox_size SET deliveries = deliveries - 1; END;
        """,
        // 15: history is read in `notifications_by_id` order, which is
        // history order (`NotificationID`), so its own index goes: one
        // leaf page of the user's less to write per publish (bytes per
        // publish, docs/BENCHMARKS.md).
        """
        DROP INDEX notifications_history;
        """,
    ]

    /// Preferences (SPEC section 12), one row per user that saved any:
    /// their wire form without `critical` (`Preferences.json`), read by
    /// key for every publish. A save's change has no presence: every
    /// device receives it (`ChangeRecord.bytes(for:)`).
    private static let preferencesMigration = """
        CREATE TABLE preferences (
            app         TEXT NOT NULL,
            user        TEXT NOT NULL,
            preferences TEXT NOT NULL,
            PRIMARY KEY (app, user)
        ) WITHOUT ROWID;
        """

    /// Brings the database to version `target` (internal for tests, which
    /// build files of older versions with it).
    static func migrate(_ db: SQLiteDatabase, path: String, to target: Int64 = schemaVersion) throws(StoreError) {
        try db.immediateTransaction { () throws(StoreError) in
            // Again under the write lock: another process may have migrated.
            try checkVersion(db, path: path)
            let from = try db.int("PRAGMA user_version") ?? 0
            guard from < target else { return }
            for v in (from + 1)...target {
                try db.script(migrations[Int(v - 1)])
                if v == 1 {
                    try db.execute("INSERT INTO meta (key, value) VALUES ('epoch', ?)", [.text("s-" + Random.hex(12))])
                    try db.execute("INSERT INTO meta (key, value) VALUES ('created_at', ?)", [.text(RFC3339.format(WallClock.now()))])
                }
                if v == 3 { try backfillCounts(db) }
                try setMeta("schema_version", String(v), in: db)
                try db.execute("PRAGMA user_version = \(v)")
            }
        }
    }

    /// A value of `meta` (the epoch, the partition layout, ...), or nil.
    static func meta(_ key: String, in db: SQLiteDatabase) throws(StoreError) -> String? {
        try db.text("SELECT value FROM meta WHERE key = ?", [.text(key)])
    }

    /// Sets a value of `meta`, in the caller's transaction.
    static func setMeta(_ key: String, _ value: String, in db: SQLiteDatabase) throws(StoreError) {
        try db.execute("INSERT INTO meta (key, value) VALUES (?, ?) ON CONFLICT (key) DO UPDATE SET value = excluded.value",
                       [.text(key), .text(value)])
    }

    // MARK: Transactions

    /// Refuses work on a closed store, or inside a transaction SQLite has
    /// already rolled back after an error (SQLITE_FULL, IOERR, ...): the
    /// caller must `rollback()` first, so nothing of it commits piecemeal.
    private func check() throws(StoreError) {
        guard db.isOpen else { throw StoreError("sqlite (\(path)): the store is closed") }
        if inTransaction && db.autocommit {
            throw StoreError("sqlite (\(path)): the transaction was rolled back after an earlier error; roll back and retry")
        }
    }

    public func begin() throws(StoreError) {
        try check()
        guard !inTransaction else { throw StoreError("sqlite (\(path)): begin() inside an open transaction") }
        try db.execute("BEGIN IMMEDIATE")
        inTransaction = true
    }

    public func commit() throws(StoreError) {
        guard inTransaction else { return }
        defer { inTransaction = false }
        guard db.isOpen else { throw StoreError("sqlite (\(path)): the store is closed") }
        if db.autocommit {
            throw StoreError("sqlite (\(path)): the transaction was rolled back after an earlier error; nothing of it was committed")
        }
        do throws(StoreError) {
            try db.execute("COMMIT")
        } catch {
            if !db.autocommit { _ = try? db.execute("ROLLBACK") }
            throw error
        }
    }

    public func rollback() {
        guard inTransaction else { return }
        inTransaction = false
        if db.isOpen && !db.autocommit { _ = try? db.execute("ROLLBACK") }
    }

    /// Runs a multi-statement write atomically: inside a savepoint within an
    /// open transaction (a failure undoes this write alone), else as its own
    /// transaction.
    private func write<T>(_ body: () throws(StoreError) -> T) throws(StoreError) -> T {
        try check()
        if inTransaction {
            try db.execute("SAVEPOINT herald_write")
            do throws(StoreError) {
                let r = try body()
                try db.execute("RELEASE herald_write")
                return r
            } catch {
                if !db.autocommit {
                    _ = try? db.execute("ROLLBACK TO herald_write")
                    _ = try? db.execute("RELEASE herald_write")
                }
                throw error
            }
        }
        return try db.immediateTransaction(body)
    }

    // MARK: Queries whose plans matter (tests check they use the indexes)

    /// A stored notification as `SQLiteReads.notification` decodes it: its
    /// own JSON, or the seq of the change holding it and that change.
    static let storedNotification = "n.json, n.seq, c.change"
    static let notificationsWithChanges = """
        notifications n LEFT JOIN changes c ON c.app = n.app AND c.user = n.user AND c.seq = n.seq
        """
    static let notificationByIdSQL = """
        SELECT \(storedNotification) FROM \(notificationsWithChanges) WHERE n.app = ? AND n.user = ? AND n.id = ?
        """
    static let notificationByAppIdSQL = """
        SELECT \(storedNotification) FROM \(notificationsWithChanges)
        WHERE n.app = ? AND n.user = ? AND n.app_notification_id = ?
        """
    /// History order is id order (`NotificationID`; ids compare as bytes
    /// under the BINARY collation): `notifications_by_id` backwards.
    static let historyFirstSQL = """
        SELECT \(storedNotification) FROM \(notificationsWithChanges) WHERE n.app = ? AND n.user = ?
        ORDER BY n.id DESC LIMIT ?
        """
    /// Keyset pagination from any position (`createdAt`, id): `id < ?3`,
    /// above every id of `createdAt` or before (`NotificationID.above`),
    /// bounds the index range; the rest drops the key itself and what comes before it among
    /// equal createdAt (a position's id need not be of its millisecond).
    static let historyAfterSQL = """
        SELECT \(storedNotification) FROM \(notificationsWithChanges)
        WHERE n.app = ?1 AND n.user = ?2 AND n.id < ?3
          AND (n.created_at < ?4 OR (n.created_at = ?4 AND n.id < ?5))
        ORDER BY n.id DESC LIMIT ?6
        """
    /// Never below the floor, where only changes still pointed at remain.
    static let changesAfterSQL = """
        SELECT seq, at, change, before_unread, before_platforms, before_tags, after_unread, after_platforms, after_tags,
               before_unseen, after_unseen
        FROM changes WHERE app = ?1 AND user = ?2
          AND seq > max(?3, coalesce((SELECT floor FROM feeds WHERE app = ?1 AND user = ?2), 0))
        ORDER BY seq LIMIT ?4
        """
    /// The latest change per user in a pruning call's window: changes from
    /// its start key (where the last call stopped: what is older is pruned
    /// already or still pointed at) to its end key, both in `changes_by_at`
    /// order (`at`, then the primary key), start included. Without
    /// statistics the planner would rather scan the whole table in key
    /// order (to skip a sort) than read a range of the `at` index.
    static let pruneScanSQL = """
        SELECT app, user, max(seq) FROM changes INDEXED BY changes_by_at
        WHERE (at, app, user, seq) >= (?1, ?2, ?3, ?4) AND (at, app, user, seq) < (?5, ?6, ?7, ?8) GROUP BY app, user
        """
    /// The key of the change past the first ?6 from a start key, before ?5:
    /// where a limited call's window ends.
    static let pruneBoundarySQL = """
        SELECT at, app, user, seq FROM changes INDEXED BY changes_by_at
        WHERE (at, app, user, seq) >= (?1, ?2, ?3, ?4) AND at < ?5 ORDER BY at, app, user, seq LIMIT 1 OFFSET ?6
        """
    /// A user's changes after the floor up to a seq, but those a
    /// notification still points at. (Reading `notification_id`, stored
    /// after the change's JSON, walks a large change's overflow pages, as
    /// deleting it does anyway.)
    static let pruneUserSQL = """
        DELETE FROM changes WHERE app = ?1 AND user = ?2 AND seq > ?3 AND seq <= ?4
          AND NOT EXISTS (SELECT 1 FROM notifications n WHERE n.app = ?1 AND n.user = ?2
                                                          AND n.id = changes.notification_id AND n.seq = changes.seq)
        """
    static func dueSQL(_ d: Deadline) -> String {
        """
        SELECT n.app, n.user, \(storedNotification) FROM \(notificationsWithChanges)
        WHERE n.\(d.column) <= ? ORDER BY n.\(d.column) LIMIT ?
        """
    }
    /// `IS NOT NULL` lets the wake index (of only the rows with a time) serve it.
    static func nextSQL(_ d: Deadline) -> String {
        "SELECT min(\(d.column)) FROM notifications WHERE \(d.column) IS NOT NULL"
    }
    /// The feed row's counts (notifications for everyone) and the others.
    static let countsSQL = """
        SELECT '*', '', unread, no_interaction, total, unseen FROM feeds WHERE app = ?1 AND user = ?2 AND total > 0
        UNION ALL
        SELECT platforms, tags, unread, no_interaction, total, unseen FROM counts WHERE app = ?1 AND user = ?2
        """

    /// The registrations holding a handle among users of app ?1 (?2: a
    /// JSON array of their ids), in registration order: a probe per user of
    /// `devices_with_push`, which holds only them, so a user without one
    /// reads no device.
    static let pushDevicesSQL = """
        SELECT d.user, d.device_id, d.platform, d.tags, d.last_seen_at, d.view_generation, d.push
        FROM json_each(?2) AS k JOIN devices d INDEXED BY devices_with_push ON d.app = ?1 AND d.user = k.value
        WHERE d.push IS NOT NULL ORDER BY d.rowid
        """

    // MARK: Reads (shared with readers)

    public func feed(_ user: UserKey) throws(StoreError) -> FeedState { try check(); return try reads.feed(user) }

    public func notification(_ user: UserKey, id: String) throws(StoreError) -> Notification? {
        try check()
        return try reads.notification(user, id: id)
    }

    public func notification(_ user: UserKey, appNotificationId: String) throws(StoreError) -> Notification? {
        try check()
        return try reads.notification(user, appNotificationId: appNotificationId)
    }

    public func changes(_ user: UserKey, after: Int64, limit: Int) throws(StoreError) -> [ChangeRecord] {
        try check()
        return try reads.changes(user, after: after, limit: limit)
    }

    public func history(_ user: UserKey, after: HistoryKey?, limit: Int) throws(StoreError) -> [Notification] {
        try check()
        return try reads.history(user, after: after, limit: limit)
    }

    public func counts(_ user: UserKey) throws(StoreError) -> [TargetingCounts] { try check(); return try reads.counts(user) }

    /// A file holds its partition's users only (`SQLitePartitionFiles`), so all of its rows are `partition`'s.
    public func due(_ deadline: Deadline, until: Millis, limit: Int, in partition: Partition) throws(StoreError) -> [(UserKey, Notification)] {
        try check()
        return try reads.due(deadline, until: until, limit: limit)
    }

    public func devices(_ user: UserKey) throws(StoreError) -> [Device] { try check(); return try reads.devices(user) }

    public func pushDevices(of users: [UserKey]) throws(StoreError) -> [UserKey: [Device]] {
        try check()
        return try reads.pushDevices(of: users)
    }

    public func next(_ deadline: Deadline) throws(StoreError) -> Millis? { try check(); return try reads.next(deadline) }

    public func usersWithDevices(app: String) throws(StoreError) -> [(user: String, devices: [Device])] {
        try check()
        return try reads.usersWithDevices(app: app)
    }

    /// A reader on a second, read-only connection; nil for an in-memory
    /// database, which another connection would not see.
    public func makeReader() throws(StoreError) -> StoreReader? {
        try check()
        guard !Self.isMemoryPath(path) else { return nil }
        return try SQLiteStoreReader(path: path, epoch: epoch, busyTimeoutMillis: busyTimeoutMillis)
    }

    // MARK: Writing notifications and their changes

    /// Assigns the user's next seq (head + 1) in the current transaction,
    /// and moves the user's counts by `deltas`: those of notifications for
    /// everyone in the same statement (they live in the feed row), the
    /// others in `counts`. Drops the change `replaced` points at (the
    /// notification's before this write) if only that pointer kept it.
    private func nextSeq(_ user: UserKey, counting deltas: [CountDelta], replacing replaced: Int64?) throws(StoreError) -> Int64 {
        // At most one delta per targeting (`CountDelta.replacing`).
        let everyone = deltas.first { $0.key == .everyone }
        var feed: FeedState?
        try db.query("""
            INSERT INTO feeds (app, user, head, floor, unread, no_interaction, total, unseen) VALUES (?, ?, 1, 0, ?, ?, ?, ?)
            ON CONFLICT (app, user) DO UPDATE SET head = head + 1, unread = unread + excluded.unread,
                no_interaction = no_interaction + excluded.no_interaction, total = total + excluded.total,
                unseen = unseen + excluded.unseen
            RETURNING head, floor
            """, [.text(user.app), .text(user.user), .int(Int64(everyone?.unread ?? 0)),
                  .int(Int64(everyone?.noInteraction ?? 0)), .int(Int64(everyone?.total ?? 0)),
                  .int(Int64(everyone?.unseen ?? 0))]) { r throws(StoreError) in
            feed = FeedState(head: r.int64(0), floor: r.int64(1))
            return false
        }
        guard let feed else { throw StoreError("sqlite (\(path)): no seq assigned") }
        try Self.count(db, user, deltas.filter { $0.key != .everyone })
        if let replaced, replaced <= feed.floor {
            try db.execute("DELETE FROM changes WHERE app = ? AND user = ? AND seq = ?",
                           [.text(user.app), .text(user.user), .int(replaced)])
        }
        return feed.head
    }

    /// A presence's unread, platforms, tags and unseen columns.
    private static func presenceColumns(_ p: Presence?) -> [SQLiteValue] {
        guard let p else { return [.null, .null, .null, .null] }
        let c = StoredForm.columns(p.targeting)
        return [.int(p.unread ? 1 : 0), c.platforms.map(SQLiteValue.text) ?? .null, c.tags.map(SQLiteValue.text) ?? .null,
                .int(p.unseen ? 1 : 0)]
    }

    private func append(_ user: UserKey, _ r: ChangeRecord, notificationId: String?) throws(StoreError) {
        try db.execute("""
            INSERT INTO changes (app, user, seq, at, change, before_unread, before_platforms, before_tags, before_unseen,
                                 after_unread, after_platforms, after_tags, after_unseen, notification_id)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)
            """, [.text(user.app), .text(user.user), .int(r.seq), .int(r.at), .utf8(r.encoded[...])]
                + Self.presenceColumns(r.before) + Self.presenceColumns(r.after)
                + [notificationId.map(SQLiteValue.text) ?? .null])
    }

    /// A stored notification's targeting from its JSON, as rows written
    /// before version 5 hold it (and migration 3 reads it, before the
    /// columns exist). Only targeted rows need the JSON parsed.
    private static let jsonPlatforms = "CASE WHEN targeted THEN json_extract(json, '$.targetPlatforms') END"
    private static let jsonTags = "CASE WHEN targeted THEN json_extract(json, '$.targetTags') END"
    private static let jsonTargetingColumns = "\(jsonPlatforms), \(jsonTags)"
    /// A stored notification's targeting, as `storedTargeting` decodes it:
    /// from the JSON of a row written before version 5 (no `seq`), else
    /// from its columns.
    private static let targetingColumns = """
        CASE WHEN seq IS NULL THEN \(jsonPlatforms) ELSE target_platforms END,
        CASE WHEN seq IS NULL THEN \(jsonTags) ELSE target_tags END
        """
    private static let storedCountedSQL = """
        SELECT read_state, user_action_state, \(targetingColumns), seq, seen_state FROM notifications
        WHERE app = ? AND user = ? AND id = ?
        """

    /// What the counts know of a stored notification, and the seq of the
    /// change it points at (`nextSeq`'s `replacing`). A SELECT, not the
    /// DELETE's RETURNING: SQLite 3.40 returns wrong values there for a
    /// column added by ALTER TABLE to a row written before (`seq IS NULL`
    /// came back false).
    private func stored(_ user: UserKey, id: String) throws(StoreError) -> (Counted, replaced: Int64?)? {
        var out: (Counted, replaced: Int64?)?
        try db.query(Self.storedCountedSQL, [.text(user.app), .text(user.user), .text(id)]) { r throws(StoreError) in
            out = (Self.counted(r), r.optionalInt64(4))
            return false
        }
        return out
    }

    /// Decodes `targetingColumns` the way `Notification(json:)` reads them.
    private static func storedTargeting(_ r: SQLiteRow, _ col: Int32) -> Targeting {
        Targeting(platforms: r.json(col)?.arrayValue?.compactMap { $0.stringValue.flatMap(Platform.init(rawValue:)) },
                  tags: r.text(col + 1).flatMap { try? TagExpression.parse($0) })
    }

    /// Decodes read_state, user_action_state, `targetingColumns` and (at 5) seen_state.
    private static func counted(_ r: SQLiteRow) -> Counted {
        Counted(targeting: storedTargeting(r, 2), unread: r.text(0) == ReadState.unread.rawValue,
                unseen: r.text(5) == SeenState.unseen.rawValue, noInteraction: r.text(1) == UserActionState.noInteraction.rawValue)
    }

    /// Applies `deltas` to `user`'s rows in `counts`, deleting a row whose
    /// total reaches 0 (also the migration 3 backfill, before the feed row
    /// had counts, and before version 11 added `unseen`: `unseen` false
    /// leaves that column out).
    private static func count(_ db: SQLiteDatabase, _ user: UserKey, _ deltas: [CountDelta], unseen: Bool = true) throws(StoreError) {
        for d in deltas {
            let key: [SQLiteValue] = [.text(user.app), .text(user.user), .text(d.key.platforms), .text(d.key.tags)]
            let total = try db.int("""
                INSERT INTO counts (app, user, platforms, tags, unread, no_interaction, total\(unseen ? ", unseen" : ""))
                VALUES (?, ?, ?, ?, ?, ?, ?\(unseen ? ", ?" : ""))
                ON CONFLICT (app, user, platforms, tags) DO UPDATE SET
                    unread = unread + excluded.unread, no_interaction = no_interaction + excluded.no_interaction,
                    total = total + excluded.total\(unseen ? ", unseen = unseen + excluded.unseen" : "")
                RETURNING total
                """, key + [.int(Int64(d.unread)), .int(Int64(d.noInteraction)), .int(Int64(d.total))]
                    + (unseen ? [.int(Int64(d.unseen))] : []))
            if total == 0 {
                try db.execute("DELETE FROM counts WHERE app = ? AND user = ? AND platforms = ? AND tags = ?", key)
            }
        }
    }

    /// Migration 3: the counts of the notifications already stored. SQLite
    /// groups them; the groups whose platforms differ only in order or
    /// repeats add up in the same row.
    private static func backfillCounts(_ db: SQLiteDatabase) throws(StoreError) {
        var groups: [(UserKey, CountDelta)] = []
        try db.query("""
            SELECT app, user, \(jsonTargetingColumns),
                   sum(read_state = 'unread'), sum(user_action_state = 'noInteraction'), count(*)
            FROM notifications GROUP BY 1, 2, 3, 4
            """) { r throws(StoreError) in
            guard let app = r.text(0), let user = r.text(1) else { return true }
            let targeting = storedTargeting(r, 2)
            groups.append((UserKey(app: app, user: user),
                           CountDelta(key: TargetingKey(targeting), targeting: targeting.canonical, unread: Int(r.int64(4)),
                                      unseen: 0, noInteraction: Int(r.int64(5)), total: Int(r.int64(6)))))
            return true
        }
        for (user, d) in groups { try count(db, user, [d], unseen: false) }
    }

    // The counts move by what was stored, not by the caller's `previous` or
    // `n`: they stay those of the live notifications whatever a caller passes.

    public func upsert(_ user: UserKey, _ n: Notification, previous: Notification?, at: Millis) throws(StoreError) -> ChangeRecord {
        try write { () throws(StoreError) -> ChangeRecord in
            let old = try stored(user, id: n.id)
            let seq = try nextSeq(user, counting: CountDelta.replacing(old?.0, by: Counted(n)), replacing: old?.replaced)
            let r = ChangeRecord(change: Change(seq: seq, op: .upsert(n)), before: previous.map(Presence.init),
                                 after: Presence(n), at: at)
            // The JSON goes only into the change: written once (migration 5).
            try db.execute("""
                INSERT INTO notifications (app, user, id, app_notification_id, created_at, expires_at,
                                           read_state, user_action_state, version, targeted, json, seq,
                                           target_platforms, target_tags, seen_state, snoozed_until)
                VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, '', ?, ?, ?, ?, ?)
                ON CONFLICT (app, user, id) DO UPDATE SET
                    app_notification_id = excluded.app_notification_id, created_at = excluded.created_at,
                    expires_at = excluded.expires_at, read_state = excluded.read_state, seen_state = excluded.seen_state,
                    user_action_state = excluded.user_action_state, version = excluded.version,
                    targeted = excluded.targeted, json = '', seq = excluded.seq,
                    target_platforms = excluded.target_platforms, target_tags = excluded.target_tags,
                    snoozed_until = excluded.snoozed_until
                """, [.text(user.app), .text(user.user), .text(n.id), .text(n.appNotificationId),
                      .int(n.createdAt), .int(n.expiresAt), .text(n.readState.rawValue),
                      .text(n.userActionState.rawValue), .int(n.version),
                      .int(n.targetPlatforms == nil && n.targetTags == nil ? 0 : 1), .int(seq),
                      n.targetPlatforms.map { .utf8(JSON.array($0.map { .string($0.rawValue) }).encoded[...]) } ?? .null,
                      n.targetTags.map { .text($0.source) } ?? .null, .text(n.seenState.rawValue),
                      n.snoozedUntil.map { .int($0) } ?? .null])
            try append(user, r, notificationId: n.id)
            return r
        }
    }

    public func delete(_ user: UserKey, _ n: Notification, reason: DeleteReason, at: Millis) throws(StoreError) -> ChangeRecord {
        try write { () throws(StoreError) -> ChangeRecord in
            let old = try stored(user, id: n.id)
            try db.execute("DELETE FROM notifications WHERE app = ? AND user = ? AND id = ?",
                           [.text(user.app), .text(user.user), .text(n.id)])
            let seq = try nextSeq(user, counting: CountDelta.replacing(old?.0, by: nil), replacing: old?.replaced)
            let op = Change.Op.delete(id: n.id, appNotificationId: n.appNotificationId, reason: reason)
            let r = ChangeRecord(change: Change(seq: seq, op: op), before: Presence(n), after: nil, at: at)
            try append(user, r, notificationId: nil)
            return r
        }
    }

    public func savePreferences(_ user: UserKey, _ p: Preferences, at: Millis) throws(StoreError) -> ChangeRecord {
        try write { () throws(StoreError) -> ChangeRecord in
            let seq = try nextSeq(user, counting: [], replacing: nil)
            try db.execute("INSERT OR REPLACE INTO preferences (app, user, preferences) VALUES (?, ?, ?)",
                           [.text(user.app), .text(user.user), .utf8(p.with(critical: []).json.encoded[...])])
            let r = ChangeRecord(change: Change(seq: seq, op: .preferences(p)), before: nil, after: nil, at: at)
            try append(user, r, notificationId: nil)
            return r
        }
    }

    public func preferences(_ user: UserKey) throws(StoreError) -> Preferences { try check(); return try reads.preferences(user) }

    // MARK: Retention

    /// Drops, for every user with changes recorded before `before`, those up
    /// to the last such one and raises the feed's floor to it, so that every
    /// change after the floor is still kept. Changes a notification points
    /// at (it keeps its JSON only there) stay below the floor until it
    /// changes or goes (`nextSeq`). A call looks only at changes from where
    /// the last one stopped (`PruneKey`), as what is older was pruned or is
    /// kept; at all of them if the clock went back past that. It stops
    /// after `limit` changes, or at `before`, and records where.
    public func pruneChanges(before: Millis, limit: Int) throws(StoreError) -> Pruned {
        let limit = max(limit, 1)  // OFFSET 0 would end every window where it starts
        return try write { () throws(StoreError) -> Pruned in
            let last = try Self.meta("pruned_before", in: db).map(PruneKey.init(stored:)) ?? PruneKey(at: 0)
            let start = last.at <= before ? last : PruneKey(at: 0)
            // A limited call's window ends at the change past its first
            // `limit`, inside an instant if need be (a send to many users
            // writes all their changes at one instant).
            var end = PruneKey(at: before)
            if limit < .max {
                try db.query(Self.pruneBoundarySQL, start.values + [.int(before), .int(Int64(limit))]) { r throws(StoreError) in
                    end = PruneKey(at: r.int64(0), app: r.text(1) ?? "", user: r.text(2) ?? "", seq: r.int64(3))
                    return false
                }
            }
            var cuts: [(UserKey, Int64)] = []
            try db.query(Self.pruneScanSQL, start.values + end.values) { r throws(StoreError) in
                if let app = r.text(0), let u = r.text(1) { cuts.append((UserKey(app: app, user: u), r.int64(2))) }
                return true
            }
            var pruned = 0
            for (user, seq) in cuts {
                let key: [SQLiteValue] = [.text(user.app), .text(user.user)]
                let floor = try reads.feed(user).floor
                guard seq > floor else { continue }
                pruned += Int(try db.int("SELECT count(*) FROM changes WHERE app = ? AND user = ? AND seq > ? AND seq <= ?",
                                         key + [.int(floor), .int(seq)]) ?? 0)
                try db.execute(Self.pruneUserSQL, key + [.int(floor), .int(seq)])
                try db.execute("UPDATE feeds SET floor = ? WHERE app = ? AND user = ?", [.int(seq)] + key)
            }
            try Self.setMeta("pruned_before", end.stored, in: db)
            return Pruned(changes: pruned, more: end.at < before)
        }
    }

    /// A change's place in `changes_by_at` order; where a pruning call's
    /// window starts or ends. Stored (meta 'pruned_before') as its instant
    /// alone when it is an instant's start, else as `at app user seq`,
    /// tab-separated (ids never hold a tab).
    struct PruneKey: Equatable {
        var at: Int64
        var app = "", user = ""
        var seq: Int64 = 0

        init(at: Int64, app: String = "", user: String = "", seq: Int64 = 0) {
            self.at = at; self.app = app; self.user = user; self.seq = seq
        }

        init(stored: String) {
            let parts = stored.split(separator: "\t", omittingEmptySubsequences: false)
            at = Int64(parts[0]) ?? 0
            if parts.count == 4 { app = String(parts[1]); user = String(parts[2]); seq = Int64(parts[3]) ?? 0 }
        }

        var stored: String { app.isEmpty ? String(at) : "\(at)\t\(app)\t\(user)\t\(seq)" }
        var values: [SQLiteValue] { [.int(at), .text(app), .text(user), .int(seq)] }
    }

    // MARK: Writing devices

    public func saveDevice(_ user: UserKey, _ device: Device) throws(StoreError) {
        try check()
        try db.execute("""
            INSERT INTO devices (app, user, device_id, platform, tags, last_seen_at, view_generation, push, push_key)
            VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)
            ON CONFLICT (app, user, device_id) DO UPDATE SET
                platform = excluded.platform, tags = excluded.tags, last_seen_at = excluded.last_seen_at,
                view_generation = excluded.view_generation, push = excluded.push, push_key = excluded.push_key
            """, [.text(user.app), .text(user.user), .text(device.deviceId), .text(device.platform.rawValue),
                  .utf8(StoredForm.tags(device.tags)[...]), .int(device.lastSeenAt),
                  .int(device.viewGeneration), device.push.map { .utf8($0.json.encoded[...]) } ?? .null,
                  device.push.map { .text($0.key) } ?? .null])
    }

    public func deleteDevice(_ user: UserKey, id: String) throws(StoreError) -> Bool {
        try check()
        try dropPushes(user, deviceId: id)
        return try db.execute("DELETE FROM devices WHERE app = ? AND user = ? AND device_id = ?",
                              [.text(user.app), .text(user.user), .text(id)]) > 0
    }

    public func pruneDevices(lastSeenBefore before: Millis) throws(StoreError) -> Int {
        try check()
        try db.execute("DELETE FROM push_tap_spacing WHERE not_before < ?", [.int(before)])
        return try db.execute("DELETE FROM devices WHERE last_seen_at < ?", [.int(before)])
    }
}

// MARK: The push outbox
extension SQLiteStore {
    static let pushOutbox = OutboxSQL.sqlite("push_outbox", returning: "id, app, user, device_id, message, committed_at, attempts, generation")

    @discardableResult
    public func enqueuePush(_ user: UserKey, deviceId: String, _ message: PushMessage, at: Millis,
                            claimUntil: Millis?) throws(StoreError) -> PushJob? {
        try check()
        var job: PushJob?
        // A new row has generation 0; a tap joined to one there has more.
        // ("WHERE true" tells SQLite's parser the ON CONFLICT is the upsert's.)
        try db.query("""
            INSERT INTO push_outbox (app, user, device_id, kind, message, committed_at, due_at, claimed_until)
            SELECT ?1, ?2, ?3, ?4, ?5, ?6, due, CASE WHEN due = ?6 THEN ?7 ELSE 0 END
            FROM (SELECT max(?6, coalesce((SELECT not_before FROM push_tap_spacing
                                           WHERE ?4 = 'tap' AND app = ?1 AND user = ?2 AND device_id = ?3), ?6)) AS due)
            WHERE true
            ON CONFLICT (app, user, device_id) WHERE kind = 'tap' DO UPDATE SET
                message = excluded.message, generation = generation + 1
            RETURNING id, generation, claimed_until
            """, [.text(user.app), .text(user.user), .text(deviceId), .text(message.kind.rawValue),
                  .utf8(message.json.encoded[...]), .int(at), .int(claimUntil ?? 0)]) { r throws(StoreError) in
            if r.int64(1) == 0, r.int64(2) != 0 {
                job = PushJob(id: r.int64(0), user: user, deviceId: deviceId, message: message, committedAt: at)
            }
            return false
        }
        return job
    }

    public func claimPushes(now: Millis, until: Millis, limit: Int) throws(StoreError) -> [PushJob] {
        try check()
        var out: [PushJob] = []
        try db.query(Self.pushOutbox.claim(), [.int(until), .int(now), .int(Int64(limit))]) { r throws(StoreError) in
            guard let app = r.text(1), let u = r.text(2), let d = r.text(3),
                  let m = r.json(4).flatMap(PushMessage.init(json:)) else { throw reads.corrupt("push") }
            out.append(PushJob(id: r.int64(0), user: UserKey(app: app, user: u), deviceId: d, message: m,
                               committedAt: r.int64(5), attempts: Int(r.int64(6)), generation: r.int64(7)))
            return true
        }
        // RETURNING gives rows in no set order.
        return out.sorted { $0.id < $1.id }
    }

    public func finishPush(_ job: PushJob) throws(StoreError) {
        try check()
        if try db.execute("DELETE FROM push_outbox WHERE id = ? AND generation = ?", [.int(job.id), .int(job.generation)]) == 0 {
            try db.execute("UPDATE push_outbox SET claimed_until = 0, due_at = min(due_at, committed_at) WHERE id = ?", [.int(job.id)])
        }
    }

    public func retryPush(_ job: PushJob, at: Millis) throws(StoreError) {
        try check()
        try db.execute(Self.pushOutbox.retry, [.int(at), .int(Int64(job.attempts + 1)), .int(job.id)])
    }

    public func spaceTaps(_ user: UserKey, deviceId: String, until: Millis) throws(StoreError) {
        try check()
        let args: [SQLiteValue] = [.text(user.app), .text(user.user), .text(deviceId), .int(until)]
        try db.execute("""
            INSERT INTO push_tap_spacing (app, user, device_id, not_before) VALUES (?1, ?2, ?3, ?4)
            ON CONFLICT (app, user, device_id) DO UPDATE SET not_before = excluded.not_before
            """, args)
        try db.execute("UPDATE push_outbox SET due_at = max(due_at, ?4) WHERE app = ?1 AND user = ?2 AND device_id = ?3 AND kind = 'tap'",
                       args)
    }

    public func dropPushes(_ user: UserKey, deviceId: String) throws(StoreError) {
        try check()
        try db.execute("DELETE FROM push_outbox WHERE app = ? AND user = ? AND device_id = ?",
                       [.text(user.app), .text(user.user), .text(deviceId)])
    }

    public func pushHolder(app: String, key: String) throws(StoreError) -> (user: String, deviceId: String)? {
        try check()
        var out: (String, String)?
        try db.query("SELECT user, device_id FROM devices WHERE app = ? AND push_key = ?", [.text(app), .text(key)]) { r throws(StoreError) in
            if let u = r.text(0), let d = r.text(1) { out = (u, d) }
            return false
        }
        return out
    }

    public func pendingPushes() throws(StoreError) -> Int {
        try check()
        return Int(try db.int("SELECT pushes FROM push_outbox_size") ?? 0)
    }

    public func pendingPushes(_ user: UserKey) throws(StoreError) -> [String: Int] {
        try check()
        var out: [String: Int] = [:]
        try db.query("SELECT device_id, count(*) FROM push_outbox WHERE app = ? AND user = ? GROUP BY device_id",
                     [.text(user.app), .text(user.user)]) { r throws(StoreError) in
            guard let d = r.text(0) else { throw reads.corrupt("push outbox row") }
            out[d] = Int(r.int64(1))
            return true
        }
        return out
    }

    public func sharedToken(_ name: String) throws(StoreError) -> SharedToken? {
        try check()
        var out: SharedToken?
        try db.query("SELECT value, issued_at FROM shared_tokens WHERE name = ?", [.text(name)]) { r throws(StoreError) in
            guard let v = r.text(0) else { throw reads.corrupt("shared token") }
            out = SharedToken(value: v, issuedAt: r.int64(1))
            return false
        }
        return out
    }

    public func replaceSharedToken(_ name: String, with token: SharedToken, replacing: Millis?) throws(StoreError) -> Bool {
        try check()
        guard let replacing else {
            return try db.execute("INSERT INTO shared_tokens (name, value, issued_at) VALUES (?, ?, ?) ON CONFLICT (name) DO NOTHING",
                                  [.text(name), .text(token.value), .int(token.issuedAt)]) == 1
        }
        return try db.execute("UPDATE shared_tokens SET value = ?, issued_at = ? WHERE name = ? AND issued_at = ?",
                              [.text(token.value), .int(token.issuedAt), .text(name), .int(replacing)]) == 1
    }
}

// MARK: The webhook outbox
extension SQLiteStore {
    static let webhookOutbox = OutboxSQL.sqlite("webhook_outbox", returning: OutboxSQL.webhookColumns)

    @discardableResult
    private func writeWebhooks(_ sql: String, _ args: [SQLiteValue]) throws(StoreError) -> Int {
        try check()
        return try db.execute(sql, args)
    }

    public func enqueueWebhook(app: String, url: String, eventId: String, body: [UInt8], at: Millis) throws(StoreError) {
        try writeWebhooks(Self.webhookOutbox.insertWebhook, [.text(app), .text(url), .text(eventId), .utf8(body[...]), .int(at)])
    }

    public func finishWebhook(_ job: WebhookJob) throws(StoreError) { try writeWebhooks(Self.webhookOutbox.delete, [.int(job.id)]) }

    public func retryWebhook(_ job: WebhookJob, at: Millis, attempted: Bool) throws(StoreError) {
        try writeWebhooks(Self.webhookOutbox.retry, [.int(at), .int(Int64(job.attempts + (attempted ? 1 : 0))), .int(job.id)])
    }

    public func dropWebhooks(committedBefore before: Millis, limit: Int) throws(StoreError) -> Int {
        try writeWebhooks(Self.webhookOutbox.dropOlder, [.int(before), .int(Int64(limit))])
    }

    public func claimWebhooks(app: String, url: String, now: Millis, until: Millis, limit: Int) throws(StoreError) -> [WebhookJob] {
        try check()
        var out: [WebhookJob] = []
        try db.query(Self.webhookOutbox.claimWebhooks, [.int(until), .int(now), .int(Int64(limit)), .text(app), .text(url)]) { r throws(StoreError) in
            guard let job = OutboxSQL.webhookJob(text: r.text, bytes: r.bytes, int: r.int64) else { throw reads.corrupt("webhook") }
            out.append(job)
            return true
        }
        // RETURNING gives rows in no set order.
        return out.sorted { $0.id < $1.id }
    }

    public func pendingWebhooks() throws(StoreError) -> Int {
        try check()
        return Int(try db.int("SELECT deliveries FROM webhook_outbox_size") ?? 0)
    }

    public func pendingWebhooks(app: String, url: String, upTo limit: Int) throws(StoreError) -> Int {
        try check()
        return Int(try db.int("SELECT count(*) FROM (SELECT 1 FROM webhook_outbox WHERE app = ? AND url = ? LIMIT ?)",
                              [.text(app), .text(url), .int(Int64(limit))]) ?? 0)
    }
}
