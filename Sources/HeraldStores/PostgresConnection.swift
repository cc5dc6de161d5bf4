import CPostgres
import Glibc
import HeraldCore

/// A value bound to a statement parameter (sent in text format).
enum PostgresValue {
    case int(Int64)
    case text(String)
    /// UTF-8 text given as bytes (encoded JSON).
    case utf8(ArraySlice<UInt8>)
    case bool(Bool)
    case null

    /// A text[] parameter: every element quoted, `"` and `\` escaped.
    static func textArray(_ items: [String]) -> PostgresValue {
        var out = "{"
        for (i, item) in items.enumerated() {
            out += i == 0 ? "\"" : ",\""
            for c in item.unicodeScalars {
                if c == "\"" || c == "\\" { out += "\\" }
                out.unicodeScalars.append(c)
            }
            out += "\""
        }
        return .text(out + "}")
    }
}

/// The rows of one statement's result, in text format.
final class PostgresRows {
    private let res: OpaquePointer
    let count: Int

    fileprivate init(_ res: OpaquePointer) {
        self.res = res
        count = Int(PQntuples(res))
    }

    deinit { PQclear(res) }

    func isNull(_ row: Int, _ col: Int32) -> Bool { PQgetisnull(res, Int32(row), col) != 0 }

    func buffer(_ row: Int, _ col: Int32) -> UnsafeBufferPointer<UInt8>? {
        guard !isNull(row, col), let p = PQgetvalue(res, Int32(row), col) else { return nil }
        return UnsafeRawPointer(p).withMemoryRebound(to: UInt8.self, capacity: 1) {
            UnsafeBufferPointer(start: $0, count: Int(PQgetlength(res, Int32(row), col)))
        }
    }

    func text(_ row: Int, _ col: Int32) -> String? { buffer(row, col).map { String(decoding: $0, as: UTF8.self) } }
    func bytes(_ row: Int, _ col: Int32) -> [UInt8] { buffer(row, col).map(Array.init) ?? [] }
    func json(_ row: Int, _ col: Int32) -> JSON? { buffer(row, col).flatMap(StoredForm.json) }
    func optionalInt64(_ row: Int, _ col: Int32) -> Int64? { text(row, col).flatMap { Int64($0) } }
    func int64(_ row: Int, _ col: Int32) -> Int64 { optionalInt64(row, col) ?? 0 }
    func bool(_ row: Int, _ col: Int32) -> Bool? { text(row, col).map { $0 == "t" } }
    /// Rows changed by an INSERT, UPDATE or DELETE (0 for other statements).
    var changed: Int { Int(String(cString: PQcmdTuples(res))) ?? 0 }
}

/// One libpq connection, used from one thread at a time, with a cache of
/// prepared statements. Every statement with values goes through
/// `query`/`execute`, which bind them as parameters (never spliced into SQL).
///
/// A lost connection (server restarted, network cut) fails the statement
/// with a `StoreError`; `reconnectIfLost()` (called by its owner where no
/// transaction can be open) connects again and forgets the prepared
/// statements, which died with the old session.
final class PostgresConnection {
    /// host:port/database, for messages (never the password).
    let name: String
    private let url: String
    private var conn: OpaquePointer?
    /// SQL text -> the name it was prepared under on this session.
    private var prepared: [String: String] = [:]

    /// Checks `url` without connecting: nil when libpq cannot parse it,
    /// else its host:port/database.
    static func describe(_ url: String) -> String? {
        var err: UnsafeMutablePointer<CChar>?
        guard let options = PQconninfoParse(url, &err) else {
            if let err { PQfreemem(err) }
            return nil
        }
        defer { PQconninfoFree(options) }
        var found: [String: String] = [:]
        var o = options
        while let k = o.pointee.keyword {
            if let v = o.pointee.val { found[String(cString: k)] = String(cString: v) }
            o += 1
        }
        let host = found["host"] ?? found["hostaddr"] ?? "localhost"
        return "\(host):\(found["port"] ?? "5432")/\(found["dbname"] ?? found["user"] ?? "?")"
    }

    /// `boundsLockWaits`: the session gets `lockTimeoutMillis` (a writer's;
    /// a reader takes no row locks and waits for nobody frozen).
    init(url: String, boundsLockWaits: Bool = true) throws(StoreError) {
        guard let name = Self.describe(url) else { throw StoreError("postgres: not a valid connection URL") }
        self.name = name
        self.url = url
        self.boundsLockWaits = boundsLockWaits
        try connect()
    }

    deinit { close() }

    func close() {
        if let c = conn { PQfinish(c) }
        conn = nil
        prepared.removeAll()
        pipelining = false
        unread.removeAll()
    }

    func error(_ context: String, _ detail: String, conflict: Bool = false) -> StoreError {
        StoreError("postgres (\(name)): \(context): \(detail)", conflict: conflict)
    }

    /// deadlock_detected, serialization_failure: PostgreSQL rolled the
    /// transaction back for another's sake; it may be run again. Also
    /// lock_not_available: a lock wait ran out (`lockTimeoutMillis`); and
    /// unique_violation: another node inserted the same key first (the
    /// same push handle registered on two nodes at once), which the run
    /// again reads and moves.
    static let conflictStates: Set<String> = ["40P01", "40001", lockNotAvailable, "23505"]
    static let lockNotAvailable = "55P03"

    /// The server's `lock_timeout` for the writer's session, where nothing
    /// else set it. Batches hold their users' locks for milliseconds, longer
    /// maintenance transactions keep talking to the server, and a deadlock
    /// ends after `deadlock_timeout` (1 s): a lock waited for this long is
    /// held by a node frozen in the middle of a transaction (SIGSTOP, a
    /// paused VM), or by a session outside Herald. The wait fails, the store
    /// ends the sessions of frozen nodes (`PostgresStore.fenceFrozenNodes`),
    /// and the batch runs again.
    static let lockTimeoutMillis: Int64 = 15_000
    /// A statement's lock wait ran out since the owner last cleared this.
    var lockWaitRanOut = false
    private let boundsLockWaits: Bool
    /// The session's `application_name`, also after a reconnect: `herald`,
    /// or `herald/NODE` once the store knows its node (`name`).
    private(set) var applicationName = "herald"

    /// How long a call waits on a peer that vanished without closing the
    /// connection (host down, network cut): unacknowledged data for 15 s, or
    /// 3 unanswered keepalives 5 s apart after 15 s of silence. As libpq's
    /// and as the server's parameter names.
    static let tcpBounds: [(client: String, server: String, value: String)] = [
        ("tcp_user_timeout", "tcp_user_timeout", "15000"), ("keepalives_idle", "tcp_keepalives_idle", "15"),
        ("keepalives_interval", "tcp_keepalives_interval", "5"), ("keepalives_count", "tcp_keepalives_count", "3"),
    ]

    private func connect() throws(StoreError) {
        close()
        // Defaults first: what the URL says overrides them (expand_dbname).
        // The TCP bounds fail a call on a vanished server instead of holding
        // the engine forever. The application name comes after the URL and
        // overrides it: other nodes tell this node's sessions by it.
        let settings = [("connect_timeout", "5")] + Self.tcpBounds.map { ($0.client, $0.value) }
            + [("dbname", url), ("application_name", applicationName)]
        let keys = settings.map { PostgresValue.text($0.0) } + [.null]
        let values = settings.map { PostgresValue.text($0.1) } + [.null]
        let c = Self.withCStrings(keys) { k in Self.withCStrings(values) { v in PQconnectdbParams(k, v, 1) } }
        guard let c, PQstatus(c) == CONNECTION_OK else {
            let message = c.map { Self.message(PQerrorMessage($0)) } ?? "out of memory"
            if let c { PQfinish(c) }
            throw error("cannot connect", message)
        }
        // Notices ("relation already exists, skipping") are not errors; by
        // default libpq prints them on stderr.
        PQsetNoticeProcessor(c, { _, _ in }, nil)
        conn = c
        sessions += 1
        // The same bounds on the server's side of the session: a node whose
        // host vanished mid-transaction (its session waits for the next
        // statement, holding its users' row locks, and with them every other
        // node's writes to those users) is let go within about 30 s, not
        // after the system's 2 hours. And `lockTimeoutMillis`. Only where
        // nothing else set them (server, role, URL `options`). Names and
        // values are ours.
        let lockWaits = boundsLockWaits ? [("lock_timeout", "\(Self.lockTimeoutMillis)")] : []
        let wanted = (Self.tcpBounds.map { ($0.server, $0.value) } + lockWaits)
            .map { "('\($0.0)', '\($0.1)')" }.joined(separator: ", ")
        try script("SELECT set_config(name, value, false) FROM (VALUES \(wanted)) AS wanted(name, value) "
                   + "JOIN pg_settings USING (name) WHERE source = 'default'")
    }

    /// Names the session `name` (`application_name`), now and after any
    /// reconnect. Set again each time: a transaction that rolls back undoes it.
    func name(_ name: String) throws(StoreError) {
        applicationName = name
        try query("SELECT set_config('application_name', $1, false)", [.text(name)])
    }

    var isConnected: Bool { conn.map { PQstatus($0) == CONNECTION_OK } ?? false }

    /// Sessions opened so far: what a session learned (a cache) may not
    /// hold for the next one (the database restored meanwhile).
    private(set) var sessions = 0

    /// Times this connection has waited for the server's answer: the cost
    /// that pipelining saves (tests count it).
    private(set) var roundTrips = 0

    /// Connects again when the connection was lost. Only where no
    /// transaction of ours can be open: a new session has none.
    func reconnectIfLost() throws(StoreError) {
        if !isConnected { try connect() }
    }

    /// Starts a transaction with `sql`. A connection found dead here (the
    /// server restarted since its last use, which libpq notices only when it
    /// next talks to it) is replaced once, as nothing of the transaction
    /// has run yet.
    func begin(_ sql: String = "BEGIN") throws(StoreError) {
        try reconnectIfLost()
        do throws(StoreError) {
            try script(sql)
        } catch {
            guard !isConnected else { throw error }
            try reconnectIfLost()
            try script(sql)
        }
    }

    /// Inside a transaction (also a failed one, which only a rollback ends).
    var inTransaction: Bool {
        guard let c = conn else { return false }
        let s = PQtransactionStatus(c)
        return s == PQTRANS_INTRANS || s == PQTRANS_INERROR || s == PQTRANS_ACTIVE
    }

    /// Inside a transaction that an error already doomed: PostgreSQL runs
    /// nothing more of it, and its COMMIT rolls back.
    var transactionFailed: Bool { conn.map { PQtransactionStatus($0) == PQTRANS_INERROR } ?? false }

    private static func message(_ p: UnsafePointer<CChar>?) -> String {
        guard let p else { return "unknown error" }
        // libpq's messages span lines ("...failed: Connection refused\n\tIs the server running..."): one log line.
        return String(cString: p).split(whereSeparator: \.isNewline)
            .map { $0.trimmingPrefix(while: \.isWhitespace) }.joined(separator: " ")
    }

    /// Runs `sql` with `args` as parameters; returns its rows.
    @discardableResult
    func query(_ sql: String, _ args: [PostgresValue] = []) throws(StoreError) -> PostgresRows {
        guard let c = conn else { throw error(String(sql.prefix(60)), "not connected") }
        if pipelining { return try queries([(sql, args)])[0] }
        let statement = try prepare(c, sql, args.count)
        roundTrips += 1
        let res = Self.withCStrings(args) { values in PQexecPrepared(c, statement, Int32(args.count), values, nil, nil, 0) }
        return try check(res, sql)
    }

    /// Runs `statements`; their rows, in order. Inside a pipeline they go
    /// out together, after what was sent before: one round trip for all.
    func queries(_ statements: [(sql: String, args: [PostgresValue])]) throws(StoreError) -> [PostgresRows] {
        guard pipelining, let c = conn else {
            var out: [PostgresRows] = []
            for (sql, args) in statements { out.append(try query(sql, args)) }
            return out
        }
        do throws(StoreError) {
            // Prepared first: preparing reads the results pending before it.
            for (sql, args) in statements { _ = try preparedName(c, sql, args.count) }
            for (sql, args) in statements { try enqueue(sql, args) }
            let mine = unread.suffix(statements.count)
            unread.removeLast(statements.count)
            roundTrips += 1
            try drain()
            PQsendFlushRequest(c)
            var out: [PostgresRows] = []
            for sql in mine { out.append(try nextResult(c, sql)) }
            return out
        } catch {
            abandon()
            throw error
        }
    }

    /// Runs a statement for its effect; returns the number of rows it changed.
    @discardableResult
    func execute(_ sql: String, _ args: [PostgresValue] = []) throws(StoreError) -> Int {
        let rows = try query(sql, args)
        return rows.changed
    }

    // MARK: Pipelined transactions

    /// Statements sent in the open pipeline whose results are not read yet.
    private var unread: [String] = []
    /// Inside `beginPipelined()` … `finish`/`abandon`.
    private(set) var pipelining = false

    /// Starts a transaction in libpq's pipeline mode: BEGIN and every
    /// statement given to `send` go out without waiting for an answer, so a
    /// batch of writes costs the round trips of its reads and its COMMIT,
    /// not one per write. Their results are checked in order before the
    /// next `query` returns, or at `finish`; the first error is thrown there
    /// and ends the pipeline (PostgreSQL skipped the rest of it), leaving a
    /// failed transaction for the owner to roll back.
    /// BEGIN itself is pipelined too: a batch whose reads are all answered
    /// from memory (`PostgresStore.claim`) costs the one round trip of its
    /// COMMIT.
    func beginPipelined() throws(StoreError) {
        try reconnectIfClosed()
        guard let c = conn, PQenterPipelineMode(c) == 1 else {
            throw error("BEGIN", "cannot enter pipeline mode: \(Self.message(conn.flatMap { PQerrorMessage($0) }))")
        }
        pipelining = true
        do throws(StoreError) { try enqueue("BEGIN", []) } catch {
            abandon()
            throw error
        }
    }

    /// Connects again when the connection was lost, or ended by the server
    /// since its last use (a restart, an administrator), which libpq
    /// notices only when it reads. Between transactions the server sends
    /// nothing unasked but its last words (a FATAL, then the end), so a
    /// session with anything to read now is replaced before anything of a
    /// transaction is sent: the server's restart costs no batch.
    private func reconnectIfClosed() throws(StoreError) {
        if let c = conn {
            var p = pollfd(fd: PQsocket(c), events: Int16(POLLIN), revents: 0)
            if poll(&p, 1, 0) != 0 { close() }
        }
        try reconnectIfLost()
    }

    /// Sends a statement whose result needs no reading, only checking:
    /// pipelined inside `beginPipelined()`, else run at once.
    func send(_ sql: String, _ args: [PostgresValue] = []) throws(StoreError) {
        if pipelining { return try enqueue(sql, args) }
        try execute(sql, args)
    }

    private func enqueue(_ sql: String, _ args: [PostgresValue]) throws(StoreError) {
        guard let c = conn else { throw error(String(sql.prefix(60)), "not connected") }
        let statement = try preparedName(c, sql, args.count)
        let sent = Self.withCStrings(args) { values in PQsendQueryPrepared(c, statement, Int32(args.count), values, nil, nil, 0) }
        guard sent == 1 else { throw error(String(sql.prefix(60)), Self.message(PQerrorMessage(c))) }
        unread.append(sql)
    }

    /// The name `sql` is prepared under in the pipeline's session.
    private func preparedName(_ c: OpaquePointer, _ sql: String, _ count: Int) throws(StoreError) -> String {
        if let name = prepared[sql] { return name }
        // Preparing is synchronous, which pipeline mode forbids: leave it for
        // a moment (once per statement and session), reading what is pending.
        if !unread.isEmpty { roundTrips += 1 }
        try drain()
        PQexitPipelineMode(c)
        defer { PQenterPipelineMode(c) }
        return try prepare(c, sql, count)
    }

    /// Reads the results of what was sent, in order; throws the first error
    /// (the caller then abandons the pipeline).
    private func drain() throws(StoreError) {
        guard !unread.isEmpty, let c = conn else { return }
        PQsendFlushRequest(c)
        var failure: StoreError?
        while !unread.isEmpty {
            let sql = unread.removeFirst()
            do throws(StoreError) {
                _ = try nextResult(c, sql)
            } catch {
                if failure == nil { failure = error }
                if !isConnected { unread.removeAll() }
            }
        }
        if let failure { throw failure }
    }

    /// The one result of the next pipelined statement, then the NULL that ends it.
    private func nextResult(_ c: OpaquePointer, _ sql: String) throws(StoreError) -> PostgresRows {
        PQflush(c)
        let res = PQgetResult(c)
        if res != nil { while let extra = PQgetResult(c) { PQclear(extra) } }
        if let res, PQresultStatus(res) == PGRES_PIPELINE_ABORTED {
            PQclear(res)
            throw error(String(sql.prefix(60)), "skipped after an earlier error in the transaction")
        }
        return try check(res, sql)
    }

    /// Ends the pipeline with `sql` (COMMIT): sends it and a sync, reads
    /// every result and leaves pipeline mode; throws the first error.
    /// A session lost once `sql` may have been sent, without its success,
    /// throws `outcomeUnknown` (unless the server had already refused a
    /// statement before it, which aborted the transaction).
    func finish(_ sql: String) throws(StoreError) {
        guard pipelining else {
            let wasConnected = isConnected
            do throws(StoreError) { return try script(sql) } catch {
                throw wasConnected && !isConnected ? Self.unknownOutcome(error) : error
            }
        }
        do throws(StoreError) {
            try enqueue(sql, [])
        } catch {
            abandon()
            throw error
        }
        let (failure, unanswered) = endPipeline()
        if let failure { throw unanswered ? Self.unknownOutcome(failure) : failure }
    }

    private static func unknownOutcome(_ e: StoreError) -> StoreError {
        StoreError(e.description + " (whether the transaction committed is unknown)", outcomeUnknown: true)
    }

    /// Leaves the pipeline whatever is pending, its results discarded. The
    /// transaction, if one is still open, is left for the caller to roll back.
    func abandon() { endPipeline() }

    /// Sends a sync after what was sent, reads every result up to it and
    /// leaves pipeline mode: one round trip. Returns the first error, and
    /// whether the session was lost without the last statement succeeding
    /// and with no statement refused by the server before it.
    @discardableResult private func endPipeline() -> (failure: StoreError?, unanswered: Bool) {
        guard pipelining else { return (nil, false) }
        pipelining = false
        let pending = unread
        unread.removeAll()
        guard let c = conn, isConnected else { return (error("pipeline", "the connection was lost"), !pending.isEmpty) }
        roundTrips += 1
        guard PQpipelineSync(c) == 1 else {
            close()
            return (error("pipeline", "the connection was lost"), !pending.isEmpty)
        }
        var failure: StoreError?
        // A statement before the last refused by the server (the connection
        // fine): the transaction is aborted, whatever the last one's fate.
        var refusedBefore = false, lastSucceeded = false
        for (i, sql) in pending.enumerated() where isConnected {
            do throws(StoreError) {
                _ = try nextResult(c, sql)
                lastSucceeded = i == pending.count - 1
            } catch {
                if failure == nil { failure = error }
                if isConnected, i < pending.count - 1 { refusedBefore = true }
            }
        }
        // Up to the sync: also the results of statements a failed `query` left unread.
        while isConnected {
            guard let res = PQgetResult(c) else { continue }
            let status = PQresultStatus(res)
            PQclear(res)
            if status == PGRES_PIPELINE_SYNC { break }
        }
        // The last statement's answer never came, or came as the session
        // ended (a FATAL: PostgreSQL may still have committed, as when a
        // wait for a synchronous standby is cut short).
        let unanswered = !isConnected && !lastSucceeded && !refusedBefore
        // Still in pipeline mode (the sync never came): a fresh session is
        // simpler than finding out why.
        if !isConnected || PQexitPipelineMode(c) != 1 {
            close()
            return (failure ?? error("pipeline", "the connection was lost"), unanswered)
        }
        return (failure, unanswered)
    }

    /// Runs several statements without parameters or preparing (schema
    /// work, transaction control).
    func script(_ sql: String) throws(StoreError) {
        guard let c = conn else { throw error(String(sql.prefix(60)), "not connected") }
        roundTrips += 1
        _ = try check(PQexec(c, sql), sql)
    }

    private func prepare(_ c: OpaquePointer, _ sql: String, _ count: Int) throws(StoreError) -> String {
        if let name = prepared[sql] { return name }
        let name = "h\(prepared.count)"
        roundTrips += 1
        _ = try check(PQprepare(c, name, sql, Int32(count), nil), sql)
        prepared[sql] = name
        return name
    }

    private func check(_ res: OpaquePointer?, _ sql: String) throws(StoreError) -> PostgresRows {
        guard let res else { throw error(String(sql.prefix(60)), Self.message(conn.flatMap { PQerrorMessage($0) })) }
        let status = PQresultStatus(res)
        guard status == PGRES_COMMAND_OK || status == PGRES_TUPLES_OK else {
            let state = PQresultErrorField(res, Int32(UInt8(ascii: "C"))).map { String(cString: $0) }
            var message = Self.message(PQresultErrorMessage(res))
            if message == "unknown error" || message.isEmpty { message = Self.message(conn.flatMap { PQerrorMessage($0) }) }
            PQclear(res)
            if state == Self.lockNotAvailable { lockWaitRanOut = true }
            let lost = !isConnected ? " (connection lost)" : ""
            throw error(String(sql.prefix(60)), message + (state.map { " (SQLSTATE \($0))" } ?? "") + lost,
                        conflict: state.map(Self.conflictStates.contains) ?? false)
        }
        return PostgresRows(res)
    }

    /// Calls `body` with `args` as an array of C strings (text format), nil
    /// for `.null`, all NUL-terminated in one buffer.
    private static func withCStrings<R>(_ args: [PostgresValue],
                                        _ body: (UnsafePointer<UnsafePointer<CChar>?>?) -> R) -> R {
        var buffer: [UInt8] = []
        var offsets: [Int?] = []
        for a in args {
            let start = buffer.count
            switch a {
            case .null: offsets.append(nil); continue
            case .int(let v): buffer.append(contentsOf: String(v).utf8)
            case .text(let s): buffer.append(contentsOf: s.utf8)
            case .utf8(let b): buffer.append(contentsOf: b)
            case .bool(let b): buffer.append(b ? UInt8(ascii: "t") : UInt8(ascii: "f"))
            }
            offsets.append(start)
            buffer.append(0)
        }
        return buffer.withUnsafeBufferPointer { bytes in
            bytes.withMemoryRebound(to: CChar.self) { b in
                let pointers: [UnsafePointer<CChar>?] = offsets.map { o in o.map { b.baseAddress! + $0 } }
                return pointers.withUnsafeBufferPointer { body($0.baseAddress) }
            }
        }
    }
}
