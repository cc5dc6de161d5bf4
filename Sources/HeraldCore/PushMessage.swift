/// A visible push or a shoulder tap (SPEC section 10).
public enum PushKind: String, Sendable { case alert, tap }

/// What a push says of the change behind it: the `op` of its `herald` field.
public enum PushOp: String, Sendable { case upsert, delete, state }

/// An app's alert fields: JSON pointers (RFC 6901) into a notification's payload.
public struct AlertPointers: Sendable, Equatable {
    public let title: String
    public let body: String
    public init(title: String, body: String) { self.title = title; self.body = body }

    /// Whether `p` is a JSON pointer: empty, or `/`-led tokens.
    public static func isPointer(_ p: String) -> Bool { p.isEmpty || p.hasPrefix("/") }

    /// The strings the pointers name in `payload`, nil unless both are strings.
    public func resolve(in payload: JSONObject) -> (title: String, body: String)? {
        guard let t = Self.string(at: title, in: payload), let b = Self.string(at: body, in: payload) else { return nil }
        return (t, b)
    }

    static func string(at pointer: String, in payload: JSONObject) -> String? {
        guard pointer.hasPrefix("/") else { return nil }
        var at = JSON.object(payload)
        for raw in pointer.dropFirst().split(separator: "/", omittingEmptySubsequences: false) {
            let token = unescape(raw)
            if let o = at.objectValue, let v = o[token] {
                at = v
            } else if let a = at.arrayValue, let i = Int(token), String(i) == token, a.indices.contains(i) {
                at = a[i]
            } else {
                return nil
            }
        }
        return at.stringValue
    }

    /// RFC 6901: `~1` is `/`, then `~0` is `~`.
    private static func unescape(_ token: Substring) -> String {
        var out = "", tilde = false
        for c in token {
            if tilde { out.append(c == "1" ? "/" : c == "0" ? "~" : c); tilde = false } else if c == "~" { tilde = true } else { out.append(c) }
        }
        return out
    }
}

/// One push as the outbox keeps it: everything the sender needs but the
/// handle, which it reads from the registration when it sends (so a handle
/// removed or moved since stops it).
public struct PushMessage: Sendable, Equatable {
    public var kind: PushKind
    public var op: PushOp
    /// The change's seq: the device syncs from its own cursor up to at least this.
    public var cursor: Int64
    public var epoch: String
    public var notificationId: String?
    public var title: String?
    public var body: String?
    /// APNs `thread-id`: the notification's `groupName`.
    public var threadId: String?
    public var high: Bool
    /// The change as this device receives it, when it fits a Web Push body.
    public var change: JSON?
    /// The push's lifetime (APNs `apns-expiration`, FCM `ttl`, Web Push `TTL`).
    public var expiresAt: Millis

    public init(kind: PushKind, op: PushOp, cursor: Int64, epoch: String, notificationId: String?,
                title: String? = nil, body: String? = nil, threadId: String? = nil, high: Bool = false,
                change: JSON? = nil, expiresAt: Millis) {
        self.kind = kind; self.op = op; self.cursor = cursor; self.epoch = epoch; self.notificationId = notificationId
        self.title = title; self.body = body; self.threadId = threadId; self.high = high; self.change = change
        self.expiresAt = expiresAt
    }

    /// Longest a push lives, whatever its notification's expiry (SPEC section 10).
    public static let maxLifetime: Millis = 28 * 86_400_000
    /// Largest change a Web Push body may carry beside the `herald` field:
    /// the 2,744 bytes of encrypted body it must stay within, less
    /// encryption's 103 (HeraldPush's `WebPushSender.plaintext` decides).
    public static let maxChangeBytes = 2_641

    /// The `herald` field every push carries.
    public var herald: JSON {
        ["cursor": .int(cursor), "epoch": .string(epoch), "id": notificationId.json, "op": .string(op.rawValue)]
    }

    /// The push, if any, that `record` gives a device of `viewer` whose handle
    /// is for `service`: an alert for a notification published with the
    /// app's alert fields in its payload, else a tap; Web Push gets alerts
    /// only, since a browser must show every push it receives.
    public static func plan(_ record: ChangeRecord, published: Bool, viewer: Viewer, service: PushService,
                            alert: AlertPointers?, epoch: String, now: Millis) -> PushMessage? {
        guard let bytes = record.bytes(for: viewer) else { return nil }
        let cap = now + maxLifetime
        let visible = record.after?.targeting.admits(viewer) ?? false
        switch record.change.op {
        case .upsert(let n) where visible:
            if published, let alert, let (title, body) = alert.resolve(in: n.payload) {
                let change = bytes.count <= maxChangeBytes ? try? JSONParser.parse(bytes) : nil
                return PushMessage(kind: .alert, op: .upsert, cursor: record.seq, epoch: epoch, notificationId: n.id,
                                   title: title, body: body, threadId: n.groupName, high: n.priority == .high,
                                   change: service == .webpush ? change : nil, expiresAt: min(n.expiresAt, cap))
            }
            guard service != .webpush else { return nil }
            return PushMessage(kind: .tap, op: published ? .upsert : .state, cursor: record.seq, epoch: epoch,
                               notificationId: n.id, expiresAt: min(n.expiresAt, cap))
        case .upsert(let n):
            guard service != .webpush else { return nil }
            return PushMessage(kind: .tap, op: .delete, cursor: record.seq, epoch: epoch, notificationId: n.id, expiresAt: cap)
        case .delete(let id, _, _):
            guard service != .webpush else { return nil }
            return PushMessage(kind: .tap, op: .delete, cursor: record.seq, epoch: epoch, notificationId: id, expiresAt: cap)
        case .preferences:
            return nil  // a save sends no push (SPEC section 12)
        }
    }

    /// The stored form.
    public var json: JSON {
        var o: JSONObject = ["kind": .string(kind.rawValue), "op": .string(op.rawValue), "cursor": .int(cursor),
                             "epoch": .string(epoch), "id": notificationId.json, "high": .bool(high),
                             "expiresAt": .int(expiresAt)]
        if let title { o["title"] = .string(title) }
        if let body { o["body"] = .string(body) }
        if let threadId { o["threadId"] = .string(threadId) }
        if let change { o["change"] = change }
        return .object(o)
    }

    public init?(json: JSON) {
        guard let o = json.objectValue, let kind = o["kind"]?.stringValue.flatMap(PushKind.init(rawValue:)),
              let op = o["op"]?.stringValue.flatMap(PushOp.init(rawValue:)), let cursor = o["cursor"]?.int64Value,
              let epoch = o["epoch"]?.stringValue, let expiresAt = o["expiresAt"]?.int64Value else { return nil }
        self.init(kind: kind, op: op, cursor: cursor, epoch: epoch, notificationId: o["id"]?.stringValue,
                  title: o["title"]?.stringValue, body: o["body"]?.stringValue, threadId: o["threadId"]?.stringValue,
                  high: o["high"]?.boolValue ?? false, change: o["change"], expiresAt: expiresAt)
    }
}

/// A push in the outbox. Taps to one device share one row (at most one
/// waiting or in flight): a tap recorded while that row is in flight
/// replaces its message and raises `generation`, so the row is sent again
/// rather than finished.
public struct PushJob: Sendable, Equatable {
    public let id: Int64
    public let user: UserKey
    public let deviceId: String
    public var message: PushMessage
    /// When the change behind it committed: the latency metric's start.
    public let committedAt: Millis
    public var attempts: Int
    public var generation: Int64

    public init(id: Int64, user: UserKey, deviceId: String, message: PushMessage, committedAt: Millis,
                attempts: Int = 0, generation: Int64 = 0) {
        self.id = id; self.user = user; self.deviceId = deviceId; self.message = message
        self.committedAt = committedAt; self.attempts = attempts; self.generation = generation
    }
}
