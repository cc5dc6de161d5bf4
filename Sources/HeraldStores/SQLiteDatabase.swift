import CSQLite
import CSQLitePageCache
import HeraldCore

/// A value bound to a statement parameter.
enum SQLiteValue {
    case int(Int64)
    case text(String)
    /// UTF-8 text given as bytes (encoded JSON), stored with TEXT affinity.
    case utf8(ArraySlice<UInt8>)
    case null
}

/// One result row of a stepping statement. Valid only inside the callback
/// that receives it.
struct SQLiteRow {
    let stmt: OpaquePointer

    func isNull(_ i: Int32) -> Bool { sqlite3_column_type(stmt, i) == SQLITE_NULL }
    func int64(_ i: Int32) -> Int64 { sqlite3_column_int64(stmt, i) }
    func optionalInt64(_ i: Int32) -> Int64? { isNull(i) ? nil : int64(i) }

    func text(_ i: Int32) -> String? {
        guard let p = sqlite3_column_text(stmt, i) else { return nil }
        let n = Int(sqlite3_column_bytes(stmt, i))
        return String(decoding: UnsafeBufferPointer(start: p, count: n), as: UTF8.self)
    }

    /// The column's text as UTF-8 bytes (empty when NULL).
    func bytes(_ i: Int32) -> [UInt8] {
        guard let p = sqlite3_column_text(stmt, i) else { return [] }
        return Array(UnsafeBufferPointer(start: p, count: Int(sqlite3_column_bytes(stmt, i))))
    }

    /// The column's text as UTF-8 bytes, in place (nil when NULL).
    func buffer(_ i: Int32) -> UnsafeBufferPointer<UInt8>? {
        guard let p = sqlite3_column_text(stmt, i) else { return nil }
        return UnsafeBufferPointer(start: p, count: Int(sqlite3_column_bytes(stmt, i)))
    }

    /// The column's text parsed as JSON; nil when NULL, absent or malformed.
    func json(_ i: Int32) -> JSON? { buffer(i).flatMap(StoredForm.json) }
}

/// A thin wrapper over one sqlite3 connection with a prepared-statement
/// cache. Not thread-safe: its owner (a store or a reader) is used from one
/// thread at a time, so the connection is opened without SQLite's own mutex.
final class SQLiteDatabase {
    private var handle: OpaquePointer?
    private var cache: [String: OpaquePointer] = [:]
    let path: String

    /// `readOnly` opens an existing file for reading only: SQLite refuses
    /// every write on the connection, and closing it never checkpoints.
    init(path: String, readOnly: Bool = false) throws(StoreError) {
        _ = Self.pageCacheWrapped
        self.path = path
        var db: OpaquePointer?
        let flags = (readOnly ? SQLITE_OPEN_READONLY : SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE) | SQLITE_OPEN_NOMUTEX
        let rc = sqlite3_open_v2(path, &db, flags, nil)
        guard rc == SQLITE_OK, let db else {
            let message = db.map { String(cString: sqlite3_errmsg($0)) } ?? String(cString: sqlite3_errstr(rc))
            if let db { sqlite3_close_v2(db) }
            throw StoreError("sqlite: cannot open \(path): \(message)")
        }
        sqlite3_extended_result_codes(db, 1)
        handle = db
    }

    deinit { close() }

    /// Installs the page cache wrapper (Sources/CSQLitePageCache) before the
    /// first connection opens; false if SQLite was already initialized by
    /// code that does not install it, which leaves its default cache in place.
    static let pageCacheWrapped = herald_sqlite_page_cache_install() == SQLITE_OK

    /// Truncations the wrapper passed on, and those it skipped (for tests).
    static var pageCacheTruncations: (passed: Int, skipped: Int) {
        var passed: Int64 = 0, skipped: Int64 = 0
        herald_sqlite_page_cache_counts(&passed, &skipped)
        return (Int(passed), Int(skipped))
    }

    var isOpen: Bool { handle != nil }

    func close() {
        for (_, s) in cache { sqlite3_finalize(s) }
        cache.removeAll()
        if let h = handle { sqlite3_close_v2(h) }
        handle = nil
    }

    /// True when no transaction is open (SQLite may end one by itself after
    /// some errors, e.g. SQLITE_FULL or SQLITE_IOERR).
    var autocommit: Bool {
        guard let h = handle else { return true }
        return sqlite3_get_autocommit(h) != 0
    }

    /// Rows changed by the last INSERT, UPDATE or DELETE.
    var changes: Int {
        guard let h = handle else { return 0 }
        return Int(sqlite3_changes64(h))
    }

    func error(_ rc: Int32, _ context: String) -> StoreError {
        var message = String(cString: sqlite3_errstr(rc))
        // The connection's message is more specific when it is about `rc`.
        if let h = handle, sqlite3_errcode(h) == rc & 0xFF {
            message = String(cString: sqlite3_errmsg(h))
        }
        return StoreError("sqlite (\(path)): \(context): \(message) (code \(rc))")
    }

    private func statement(_ sql: String) throws(StoreError) -> OpaquePointer {
        if let s = cache[sql] { return s }
        guard let h = handle else { throw StoreError("sqlite (\(path)): the store is closed") }
        var stmt: OpaquePointer?
        let rc = sqlite3_prepare_v3(h, sql, -1, UInt32(SQLITE_PREPARE_PERSISTENT), &stmt, nil)
        guard rc == SQLITE_OK, let stmt else {
            if let stmt { sqlite3_finalize(stmt) }
            throw error(rc, "prepare \(sql.prefix(60))")
        }
        cache[sql] = stmt
        return stmt
    }

    private func bind(_ stmt: OpaquePointer, _ args: [SQLiteValue], _ sql: String) throws(StoreError) {
        for (k, a) in args.enumerated() {
            let i = Int32(k + 1)
            let rc: Int32
            switch a {
            case .int(let v): rc = sqlite3_bind_int64(stmt, i, v)
            case .null: rc = sqlite3_bind_null(stmt, i)
            case .text(let s):
                var s = s
                rc = s.withUTF8 { Self.bindText(stmt, i, $0) }
            case .utf8(let bytes):
                rc = bytes.withUnsafeBufferPointer { Self.bindText(stmt, i, $0) }
            }
            guard rc == SQLITE_OK else { throw error(rc, "bind \(sql.prefix(60))") }
        }
    }

    private static func bindText(_ stmt: OpaquePointer, _ i: Int32, _ b: UnsafeBufferPointer<UInt8>) -> Int32 {
        guard let base = b.baseAddress, b.count > 0 else {
            return sqlite3_bind_text(stmt, i, "", 0, herald_sqlite_transient)
        }
        return base.withMemoryRebound(to: CChar.self, capacity: b.count) {
            sqlite3_bind_text64(stmt, i, $0, UInt64(b.count), herald_sqlite_transient, UInt8(SQLITE_UTF8))
        }
    }

    /// Runs `sql`, calling `each` for every row until it returns false.
    func query(_ sql: String, _ args: [SQLiteValue] = [],
               _ each: (SQLiteRow) throws(StoreError) -> Bool) throws(StoreError) {
        let stmt = try statement(sql)
        // Always leave the statement reset so it holds no read transaction
        // open (that would stall WAL checkpoints) and no bound copies.
        defer { sqlite3_reset(stmt); sqlite3_clear_bindings(stmt) }
        try bind(stmt, args, sql)
        while true {
            let rc = sqlite3_step(stmt)
            if rc == SQLITE_DONE { return }
            guard rc == SQLITE_ROW else { throw error(rc, String(sql.prefix(60))) }
            if try !each(SQLiteRow(stmt: stmt)) { return }
        }
    }

    /// Runs a statement for its effect; returns the number of rows changed.
    @discardableResult
    func execute(_ sql: String, _ args: [SQLiteValue] = []) throws(StoreError) -> Int {
        try query(sql, args) { _ throws(StoreError) in true }
        return changes
    }

    /// The first column of the first row, as an integer.
    func int(_ sql: String, _ args: [SQLiteValue] = []) throws(StoreError) -> Int64? {
        var v: Int64?
        try query(sql, args) { r throws(StoreError) in v = r.optionalInt64(0); return false }
        return v
    }

    /// The first column of the first row, as text.
    func text(_ sql: String, _ args: [SQLiteValue] = []) throws(StoreError) -> String? {
        var v: String?
        try query(sql, args) { r throws(StoreError) in v = r.text(0); return false }
        return v
    }

    /// The write-ahead log's file as SQLite names it (symlinks resolved).
    var logPath: String? {
        guard let h = handle, let db = sqlite3_db_filename(h, "main"), let wal = sqlite3_filename_wal(db) else { return nil }
        return String(cString: wal)
    }

    /// Syncs the database file through SQLite's own handle (a descriptor of
    /// our own would drop SQLite's locks on the file when closed); false if
    /// that failed.
    func syncFile() -> Bool {
        guard let h = handle else { return false }
        var file: UnsafeMutablePointer<sqlite3_file>?
        guard sqlite3_file_control(h, "main", SQLITE_FCNTL_FILE_POINTER, &file) == SQLITE_OK,
              let file, let sync = file.pointee.pMethods?.pointee.xSync else { return false }
        return sync(file, SQLITE_SYNC_NORMAL) == SQLITE_OK
    }

    /// Runs `body` in a transaction that takes the write lock at once
    /// (`BEGIN IMMEDIATE`), committed if it returns and rolled back if it
    /// throws (unless SQLite already rolled it back).
    func immediateTransaction<T>(_ body: () throws(StoreError) -> T) throws(StoreError) -> T {
        try execute("BEGIN IMMEDIATE")
        do throws(StoreError) {
            let r = try body()
            try execute("COMMIT")
            return r
        } catch {
            if !autocommit { _ = try? execute("ROLLBACK") }
            throw error
        }
    }

    /// Runs several statements without parameters or caching (schema work).
    func script(_ sql: String) throws(StoreError) {
        guard let h = handle else { throw StoreError("sqlite (\(path)): the store is closed") }
        var err: UnsafeMutablePointer<CChar>?
        let rc = sqlite3_exec(h, sql, nil, nil, &err)
        if rc != SQLITE_OK {
            let message = err.map { String(cString: $0) } ?? String(cString: sqlite3_errstr(rc))
            sqlite3_free(err)
            throw StoreError("sqlite (\(path)): \(message) (code \(rc))")
        }
    }
}

// MARK: Write-ahead log

extension SQLiteDatabase {
    typealias WALHook = @convention(c) (UnsafeMutableRawPointer?, OpaquePointer?, UnsafePointer<CChar>?, Int32) -> Int32

    /// Calls `hook(context, …, frames)` after every commit with the number
    /// of pages then in the log, in place of SQLite's automatic checkpoint
    /// (`nil` removes it, and with it every automatic checkpoint).
    func onCommit(_ context: UnsafeMutableRawPointer?, _ hook: WALHook?) {
        guard let h = handle else { return }
        sqlite3_wal_hook(h, hook, context)
    }

    /// A passive checkpoint: copies what it can of the log into the
    /// database file without waiting on any other connection. The pages in
    /// the log, or nil if it could not run now (another checkpoint is
    /// running) or failed.
    func checkpoint() -> Int32? {
        guard let h = handle else { return nil }
        var log: Int32 = 0
        guard sqlite3_wal_checkpoint_v2(h, nil, SQLITE_CHECKPOINT_PASSIVE, &log, nil) == SQLITE_OK else { return nil }
        return log
    }
}
