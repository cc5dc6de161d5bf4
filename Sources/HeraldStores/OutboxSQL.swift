/// What the push and the webhook outboxes share, in both SQL stores: a row
/// is due at `due_at`, held by the node that claimed it until
/// `claimed_until` (a lease: a node that dies holding it lets it go), and
/// tried again later with one more `attempts`. `p` starts a numbered
/// parameter: `?` for SQLite, `$` for PostgreSQL, which also skips rows
/// another node is claiming (`FOR UPDATE SKIP LOCKED`), so each row has
/// one sender.
struct OutboxSQL {
    let table: String
    /// The columns a claim reads back.
    let returning: String
    let p: String

    static func sqlite(_ table: String, returning: String) -> OutboxSQL { OutboxSQL(table: table, returning: returning, p: "?") }
    static func postgres(_ table: String, returning: String) -> OutboxSQL { OutboxSQL(table: table, returning: returning, p: "$") }

    /// Parameters: 1 held until, 2 now, 3 limit; `filter` (` AND ...`) may use 4 on.
    func claim(filter: String = "") -> String {
        """
        UPDATE \(table) SET claimed_until = \(p)1
        WHERE id IN (SELECT id FROM \(table) WHERE due_at <= \(p)2 AND claimed_until <= \(p)2\(filter)
                     ORDER BY due_at, id LIMIT \(p)3\(p == "$" ? " FOR UPDATE SKIP LOCKED" : ""))
        RETURNING \(returning)
        """
    }

    /// Parameters: 1 due at, 2 attempts, 3 id.
    var retry: String { "UPDATE \(table) SET claimed_until = 0, due_at = \(p)1, attempts = \(p)2 WHERE id = \(p)3" }

    /// A SQLite file's one writer opening it: what was claimed before was in
    /// flight when it stopped, and goes again at once.
    var releaseAll: String { "UPDATE \(table) SET claimed_until = 0 WHERE claimed_until > 0" }
}
