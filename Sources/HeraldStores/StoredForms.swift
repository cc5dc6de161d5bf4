import HeraldCore

/// The text forms the SQL stores (SQLite, PostgreSQL) keep beside a
/// notification's JSON: one implementation, so both write and read back the
/// same columns the same way.
enum StoredForm {
    /// Stored JSON nests the app's payload (itself up to the parser's
    /// default depth) two levels down: leave room for that.
    static func json(_ bytes: UnsafeBufferPointer<UInt8>) -> JSON? {
        try? JSONParser.parse(bytes, maxDepth: JSONParser.defaultMaxDepth + 8)
    }

    /// A stored notification: `json`, its row's own JSON, when `seq` is nil,
    /// else the notification inside `change`, the upsert at `seq` (the
    /// stores write a notification's JSON only there).
    static func notification(json: UnsafeBufferPointer<UInt8>?, seq: Int64?,
                             change: UnsafeBufferPointer<UInt8>?) -> Notification? {
        var bytes = json
        if let seq {
            guard let change, let range = ChangeRecord.notificationRange(inUpsert: seq, of: change) else { return nil }
            bytes = UnsafeBufferPointer(rebasing: change[range])
        }
        return bytes.flatMap(Self.json).flatMap(Notification.init(json:))
    }

    /// A presence's targeting columns: platforms comma-separated in the
    /// order given (nil for all platforms), tags the expression's source
    /// (nil for all devices).
    static func columns(_ t: Targeting) -> (platforms: String?, tags: String?) {
        (t.platforms.map { $0.map(\.rawValue).joined(separator: ",") }, t.tags?.source)
    }

    /// Reads back a presence written as `unread`, `unseen` and `columns`;
    /// nil when absent (`unread` is nil: no before for a new notification,
    /// no after for a delete). `unseen` is nil in a change recorded before
    /// it was (SQLite version 11, PostgreSQL 10): as `unread` implies
    /// (`SeenState.implied`).
    static func presence(unread: Bool?, unseen: Bool?, platforms: String?, tags: String?,
                         _ corrupt: (String) -> StoreError) throws(StoreError) -> Presence? {
        guard let unread else { return nil }
        var list: [Platform]? = nil
        if let platforms {
            list = []
            for name in platforms.split(separator: ",", omittingEmptySubsequences: true) {
                guard let p = Platform(rawValue: String(name)) else { throw corrupt("change targeting") }
                list?.append(p)
            }
        }
        var expression: TagExpression? = nil
        if let tags {
            do { expression = try TagExpression.parse(tags) } catch { throw corrupt("change tag expression") }
        }
        return Presence(targeting: Targeting(platforms: list, tags: expression), unread: unread, unseen: unseen ?? unread)
    }

    /// A stored change as the feed serves it: its stored bytes, which are
    /// its wire form, unless it is an upsert recorded before notifications
    /// carried `snoozedUntil` (the newest field; `seenState` came before
    /// it); that one is encoded again, so that every notification a client
    /// receives has every field.
    static func record(_ change: Change, json: JSON, before: Presence?, after: Presence?, at: Millis,
                       stored: () -> [UInt8]) -> ChangeRecord {
        if case .upsert = change.op, json.objectValue?["notification"]?.objectValue?["snoozedUntil"] == nil {
            return ChangeRecord(change: change, before: before, after: after, at: at)
        }
        return ChangeRecord(change: change, before: before, after: after, at: at, encoded: stored())
    }

    /// A device's push handle read back from its stored form (`PushHandle.json`).
    static func push(_ json: JSON?, isNull: Bool, _ corrupt: (String) -> StoreError) throws(StoreError) -> PushHandle? {
        guard !isNull else { return nil }
        guard let json, let h = try? PushHandle(json: json) else { throw corrupt("device push handle") }
        return h
    }

    /// A device's tags as a JSON array of strings.
    static func tags(_ tags: [String]) -> [UInt8] { JSON.array(tags.map(JSON.string)).encoded }

    /// Reads back `tags(_:)`; nil when it is not an array of strings.
    static func tags(_ json: JSON?) -> [String]? {
        guard let list = json?.arrayValue else { return nil }
        var out: [String] = []
        for t in list {
            guard let s = t.stringValue else { return nil }
            out.append(s)
        }
        return out
    }
}

extension Deadline {
    /// The column both SQL stores keep it in, indexed (`notifications_expiry`,
    /// and `notifications_wake` of only the rows with a time).
    var column: String {
        switch self {
        case .expiry: "expires_at"
        case .wake: "snoozed_until"
        }
    }
}
