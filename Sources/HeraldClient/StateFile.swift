#if canImport(CSQLite)
import CSQLite
#else
import SQLite3  // the SDK's, on Apple platforms
#endif
#if canImport(CSQLitePageCache)
import CSQLitePageCache
#endif
import HeraldCore

/// The local state on disk: an SQLite file holding the notifications (as
/// their wire JSON), the cursor, the epoch and the scope they belong to,
/// always written together in one transaction (PROTOCOL.md 5.6).
///
/// Used by its client actor only, one call at a time.
final class StateFile {
    /// SQLITE_TRANSIENT (a cast macro Swift cannot import): SQLite copies the text.
    private static let transient = unsafeBitCast(-1, to: sqlite3_destructor_type.self)
    private let db: OpaquePointer
    private let path: String

    /// What was saved, and for whom (`scope`: gateway, app, user, device).
    struct Saved {
        var scope: String?
        var state: LocalState
        /// The push handle registered for that scope, as sent (`HeraldClient.registerPush`).
        var push: String?
    }

    init(path: String) throws(HeraldClientError) {
        self.path = path
        #if canImport(CSQLitePageCache)
        // Before the process's first connection, whichever of ours opens it.
        // Not on Apple platforms: there the app's process shares SQLite with
        // the system's frameworks, which configure it first.
        _ = herald_sqlite_page_cache_install()
        #endif
        var handle: OpaquePointer?
        let rc = sqlite3_open_v2(path, &handle, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nil)
        guard rc == SQLITE_OK, let handle else {
            let message = handle.map { String(cString: sqlite3_errmsg($0)) } ?? String(cString: sqlite3_errstr(rc))
            sqlite3_close_v2(handle)
            throw .stateFile("cannot open \(path): \(message)")
        }
        db = handle
        try exec("""
            PRAGMA journal_mode = WAL;
            CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT);
            CREATE TABLE IF NOT EXISTS notifications (id TEXT PRIMARY KEY, json TEXT NOT NULL);
            """)
    }

    deinit { sqlite3_close_v2(db) }

    func load() throws(HeraldClientError) -> Saved {
        var meta: [String: String] = [:]
        try query("SELECT key, value FROM meta") { meta[$0.text(0)] = $0.text(1) }
        var notifications: [String: HeraldNotification] = [:]
        try query("SELECT json FROM notifications") { row in
            // A row this version cannot read is dropped; the cursor still
            // stands for it, so a `sync` would be needed to get it back. It
            // cannot happen with files this client wrote.
            if let json = try? JSONParser.parse(row.text(0)), let n = HeraldNotification(json: json) {
                notifications[n.id] = n
            }
        }
        let state = LocalState(notifications: notifications, cursor: meta["cursor"].flatMap { Int64($0) },
                               epoch: meta["epoch"],
                               preferences: meta["preferences"].flatMap { try? JSONParser.parse($0) }.flatMap(Preferences.init(json:)))
        return Saved(scope: meta["scope"], state: state, push: meta["push"])
    }

    /// The push handle last registered, nil when none is.
    func savePush(_ push: String?) throws(HeraldClientError) {
        try run("INSERT OR REPLACE INTO meta (key, value) VALUES ('push', ?)", [push])
    }

    /// Writes the position and the rows of `changedIds` (all rows when
    /// `replaced`) in one transaction.
    func save(_ state: LocalState, scope: String?, changedIds: Set<String>, replaced: Bool) throws(HeraldClientError) {
        try exec("BEGIN IMMEDIATE")
        do throws(HeraldClientError) {
            if replaced { try run("DELETE FROM notifications", []) }
            let ids = replaced ? Set(state.notifications.keys) : changedIds
            for id in ids {
                if let n = state.notifications[id] {
                    try run("INSERT OR REPLACE INTO notifications (id, json) VALUES (?, ?)", [id, String(decoding: n.encoded, as: UTF8.self)])
                } else {
                    try run("DELETE FROM notifications WHERE id = ?", [id])
                }
            }
            for (key, value) in [("cursor", state.cursor.map(String.init)), ("epoch", state.epoch), ("scope", scope),
                                 ("preferences", state.preferences?.json.encodedString)] {
                try run("INSERT OR REPLACE INTO meta (key, value) VALUES (?, ?)", [key, value])
            }
            try exec("COMMIT")
        } catch {
            try? exec("ROLLBACK")
            throw error
        }
    }

    // MARK: SQLite

    private func exec(_ sql: String) throws(HeraldClientError) {
        let rc = sqlite3_exec(db, sql, nil, nil, nil)
        guard rc == SQLITE_OK else { throw failure(sql) }
    }

    private struct Row {
        let stmt: OpaquePointer
        func text(_ i: Int32) -> String { sqlite3_column_text(stmt, i).map { String(cString: $0) } ?? "" }
    }

    private func prepare(_ sql: String, _ args: [String?]) throws(HeraldClientError) -> OpaquePointer {
        var stmt: OpaquePointer?
        guard sqlite3_prepare_v2(db, sql, -1, &stmt, nil) == SQLITE_OK, let stmt else { throw failure(sql) }
        for (i, arg) in args.enumerated() {
            if let arg { sqlite3_bind_text(stmt, Int32(i + 1), arg, -1, StateFile.transient) }
            else { sqlite3_bind_null(stmt, Int32(i + 1)) }
        }
        return stmt
    }

    private func query(_ sql: String, _ each: (Row) -> Void) throws(HeraldClientError) {
        let stmt = try prepare(sql, [])
        defer { sqlite3_finalize(stmt) }
        while true {
            switch sqlite3_step(stmt) {
            case SQLITE_ROW: each(Row(stmt: stmt))
            case SQLITE_DONE: return
            default: throw failure(sql)
            }
        }
    }

    private func run(_ sql: String, _ args: [String?]) throws(HeraldClientError) {
        let stmt = try prepare(sql, args)
        defer { sqlite3_finalize(stmt) }
        guard sqlite3_step(stmt) == SQLITE_DONE else { throw failure(sql) }
    }

    private func failure(_ sql: String) -> HeraldClientError {
        .stateFile("\(path): \(String(cString: sqlite3_errmsg(db))) (in \(sql.prefix(40)))")
    }
}
