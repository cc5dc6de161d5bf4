/// What the push and the webhook outboxes share, in both SQL stores: a row
/// is due at `due_at`, held by the node that claimed it until
/// `claimed_until` (a lease: a node that dies holding it lets it go), and
/// tried again later with one more `attempts`. `p` starts a numbered
/// parameter: `?` for SQLite, `$` for PostgreSQL, which also skips rows
/// another node is claiming (`FOR UPDATE SKIP LOCKED`), so each row has
/// one sender.
import HeraldCore

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

    /// Parameters: 1 before, 2 limit.
    var dropOlder: String {
        "DELETE FROM \(table) WHERE id IN (SELECT id FROM \(table) WHERE committed_at < \(p)1 LIMIT \(p)2\(p == "$" ? " FOR UPDATE SKIP LOCKED" : ""))"
    }

    /// Parameter: 1 id.
    var delete: String { "DELETE FROM \(table) WHERE id = \(p)1" }

    // The webhook outbox (SQLite migration 14, PostgreSQL 13).

    static let webhookColumns = "id, app, url, event_id, body, committed_at, attempts"

    /// Its table in a store's types. Migrations are frozen once released: change a copy, not this.
    static func webhookTable(id: String, integer: String) -> String {
        """
        CREATE TABLE webhook_outbox (
            id \(id), app text NOT NULL, url text NOT NULL, event_id text NOT NULL, body text NOT NULL,
            committed_at \(integer) NOT NULL, due_at \(integer) NOT NULL,
            claimed_until \(integer) NOT NULL DEFAULT 0, attempts integer NOT NULL DEFAULT 0
        );
        CREATE INDEX webhook_outbox_due ON webhook_outbox (app, url, due_at);
        CREATE INDEX webhook_outbox_age ON webhook_outbox (committed_at);
        """
    }

    /// Parameters: 1 app, 2 url, 3 event id, 4 body, 5 now.
    var insertWebhook: String {
        "INSERT INTO \(table) (app, url, event_id, body, committed_at, due_at) VALUES (\(p)1, \(p)2, \(p)3, \(p)4, \(p)5, \(p)5)"
    }

    /// `claim` of one endpoint's rows: parameters 4 app, 5 url.
    var claimWebhooks: String { claim(filter: " AND app = \(p)4 AND url = \(p)5") }

    /// A row of `webhookColumns`, by each store's column readers; nil when damaged.
    static func webhookJob(text: (Int32) -> String?, bytes: (Int32) -> [UInt8], int: (Int32) -> Int64) -> WebhookJob? {
        guard let app = text(1), let url = text(2), let id = text(3) else { return nil }
        return WebhookJob(id: int(0), app: app, url: url, eventId: id, body: bytes(4), committedAt: int(5), attempts: Int(int(6)))
    }
}
